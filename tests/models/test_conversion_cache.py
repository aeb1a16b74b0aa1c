"""The conversion cache (models/conversion_cache.py): a second load maps the entry and gives the same weights; a
damaged, stale or symlinked entry is rebuilt, never trusted or followed; eviction keeps the size bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from inferplug.models import conversion_cache
from inferplug.models.conversion_cache import cached_text, cached_weights
from inferplug.models.loader import load_weights
from inferplug.quant.block_linear import BlockLinear
from inferplug.quant.checkpoint_layers import GroupInt4Linear, PermutedLinear
from tests.quant_fixtures import NAMES, fixture_dir


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(conversion_cache.SIZE_ENV, raising=False)
    return tmp_path / "home"


def entries(home: Path) -> list[Path]:
    return sorted((home / "conversions").glob("*.entry"))


def counting(weights: dict):
    """A build that counts its calls: the cache's hits are the calls it does not make."""
    calls = []

    def build():
        calls.append(1)
        return dict(weights)
    return build, calls


def assert_same(ours: dict, theirs: dict):
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert type(ours[name]) is type(value), name
        if isinstance(value, torch.Tensor):
            assert ours[name].dtype == value.dtype and torch.equal(ours[name], value), name
        else:
            assert torch.equal(ours[name].dequantized(), value.dequantized()), name
            assert [b.dtype for b in ours[name].buffers()] == [b.dtype for b in value.buffers()], name


def mapped_files() -> set[str]:
    return {line.split(maxsplit=5)[5].strip() for line in Path("/proc/self/maps").read_text().splitlines()
            if len(line.split(maxsplit=5)) == 6}


@pytest.mark.parametrize("name", NAMES)
def test_second_load_maps_the_entry_and_gives_the_same_weights(cpu_kernel_ops, home, name):
    first = load_weights(fixture_dir(name), torch.float32, "cpu")
    [entry] = entries(home)
    second = load_weights(fixture_dir(name), torch.float32, "cpu")
    assert str(entry) in mapped_files()  # read through a mapping of the entry, not converted again
    assert_same(second, first)
    layer = second["model.layers.0.mlp.down_proj.weight"]
    inner = layer.inner if isinstance(layer, PermutedLinear) else layer
    assert isinstance(inner, BlockLinear)
    x = torch.randn(2, inner.in_features, generator=torch.Generator().manual_seed(0))
    assert torch.equal(layer(x), first["model.layers.0.mlp.down_proj.weight"](x))
    assert len(entries(home)) == 1


def test_every_layer_kind_and_dtype_round_trips(cpu_kernel_ops, home, monkeypatch):
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.quant.block_linear import Q4Linear, Q8HeadLinear, Q8Linear

    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(1))
    weights = {"bf16": weight.bfloat16(), "empty": torch.empty(0, 4), "int": torch.arange(5),
               "q4": Q4Linear.from_float(weight, bias=torch.ones(64)), "q8": Q8Linear.from_float(weight),
               "head": Q8HeadLinear.from_float(weight),
               "permuted": load_weights(fixture_dir("gptq-actorder-g32"), torch.float32, "cpu")[
                   "model.layers.0.self_attn.o_proj.weight"]}
    monkeypatch.setattr(cpu_kernels, "ops", lambda: None)  # the checkpoint's own groups, as on CUDA
    weights["groups"] = load_weights(fixture_dir("awq-g64"), torch.float32, "cpu")["model.layers.1.mlp.up_proj.weight"]
    assert isinstance(weights["permuted"], PermutedLinear) and isinstance(weights["groups"], GroupInt4Linear)
    build, calls = counting(weights)
    cached_weights(["kinds"], build)
    assert_same(cached_weights(["kinds"], build), weights)
    assert calls == [1]


def damage_magic(path: Path):
    path.write_bytes(b"NOTCACHE" + path.read_bytes()[8:])


def damage_header(path: Path):
    data = bytearray(path.read_bytes())
    data[20:40] = b"\xff" * 20  # inside the JSON header
    path.write_bytes(bytes(data))


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[:-64])


def grow(path: Path):
    path.write_bytes(path.read_bytes() + b"\x00" * 64)


@pytest.mark.parametrize("damage", [damage_magic, damage_header, truncate, grow, lambda p: p.write_bytes(b"")])
def test_a_damaged_entry_is_rebuilt(home, damage):
    weights = {"w": torch.arange(1000, dtype=torch.float32)}
    build, calls = counting(weights)
    cached_weights(["damaged"], build)
    [entry] = entries(home)
    damage(entry)
    assert_same(cached_weights(["damaged"], build), weights)
    assert calls == [1, 1]
    assert_same(cached_weights(["damaged"], build), weights)  # the rebuilt entry is sound again
    assert calls == [1, 1]


def test_an_entry_of_another_format_version_is_rebuilt(home, monkeypatch):
    weights = {"w": torch.ones(3, 3)}
    build, calls = counting(weights)
    cached_weights(["versioned"], build)
    monkeypatch.setattr(conversion_cache, "FORMAT_VERSION", conversion_cache.FORMAT_VERSION + 1)
    assert_same(cached_weights(["versioned"], build), weights)
    assert calls == [1, 1] and len(entries(home)) == 1  # rewritten in place


def test_a_new_conversion_version_converts_again(cpu_kernel_ops, home, monkeypatch):
    from inferplug.models import quant_checkpoint

    load_weights(fixture_dir("awq-g64"), torch.float32, "cpu")
    monkeypatch.setattr(quant_checkpoint, "CONVERSION_VERSION", quant_checkpoint.CONVERSION_VERSION + 1)
    load_weights(fixture_dir("awq-g64"), torch.float32, "cpu")
    assert len(entries(home)) == 2


def test_a_symlinked_entry_is_not_followed(home, tmp_path):
    weights = {"w": torch.arange(16, dtype=torch.float32)}
    build, calls = counting(weights)
    cached_weights(["linked"], build)
    [entry] = entries(home)
    target = tmp_path / "elsewhere.entry"  # a sound entry, but outside the cache
    os.replace(entry, target)
    entry.symlink_to(target)
    before = target.read_bytes()
    assert_same(cached_weights(["linked"], build), weights)
    assert calls == [1, 1]
    assert entry.is_file() and not entry.is_symlink()  # the rebuilt entry replaced the link
    assert target.read_bytes() == before


def test_a_text_entry_is_written_once_and_a_symlink_is_replaced_not_followed(home, tmp_path):
    calls = []

    def build():
        calls.append(1)
        return "{}"

    path = cached_text(["text"], ".tokenizer.json", build)
    assert cached_text(["text"], ".tokenizer.json", build) == path and path.read_text() == "{}" and calls == [1]
    target = tmp_path / "elsewhere.json"
    target.write_text("theirs")
    path.unlink()
    path.symlink_to(target)
    assert cached_text(["text"], ".tokenizer.json", build) == path and calls == [1, 1]
    assert not path.is_symlink() and path.read_text() == "{}" and target.read_text() == "theirs"


def test_text_entries_count_in_the_bound(home, monkeypatch):
    build, _ = counting({"w": torch.zeros(64 << 10, dtype=torch.uint8)})
    cached_weights(["a"], build)
    [first] = entries(home)
    monkeypatch.setenv(conversion_cache.SIZE_ENV, str(1.5 * first.stat().st_size / (1 << 30)))  # room for one
    os.utime(first, ns=(0, 0))
    cached_text(["text"], ".tokenizer.json", lambda: "x" * first.stat().st_size)
    assert not first.exists()  # the older weights went to make room


def test_a_symlinked_cache_dir_is_not_used(home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    home.mkdir()
    (home / "conversions").symlink_to(outside)
    build, calls = counting({"w": torch.ones(2)})
    cached_weights(["dir"], build)
    cached_weights(["dir"], build)
    assert calls == [1, 1] and not list(outside.iterdir())


def test_eviction_keeps_the_bound_and_the_recently_used(home, monkeypatch):
    weights = {"w": torch.zeros(64 << 10, dtype=torch.uint8)}
    build, calls = counting(weights)
    cached_weights(["a"], build)
    [first] = entries(home)
    monkeypatch.setenv(conversion_cache.SIZE_ENV, str(3.5 * first.stat().st_size / (1 << 30)))  # room for 3
    limit = conversion_cache.limit_bytes()
    for key in ("b", "c"):
        cached_weights([key], build)
    for age, entry in enumerate(entries(home)):  # a definite LRU order, whatever the clock's resolution
        os.utime(entry, ns=(age, age))
    cached_weights(["a"], build)  # a hit: now the most recently used
    assert calls == [1, 1, 1]
    cached_weights(["d"], build)
    kept = entries(home)
    assert len(kept) == 3 and sum(p.stat().st_size for p in kept) <= limit
    build_again, calls_again = counting(weights)
    cached_weights(["a"], build_again)
    cached_weights(["d"], build_again)
    assert calls_again == []  # "a" (just used) and "d" (just written) stayed


def test_an_entry_larger_than_the_bound_set_is_not_written(home, monkeypatch, caplog):
    monkeypatch.setenv(conversion_cache.SIZE_ENV, str(16 / (1 << 20)))  # 16 KiB
    build, calls = counting({"w": torch.zeros(1 << 20, dtype=torch.uint8)})
    cached_weights(["big"], build)
    assert not entries(home)
    assert "exceed INFERPLUG_CONVERSION_CACHE_GIB=" in caplog.text and "raise INFERPLUG_CONVERSION_CACHE_GIB" in caplog.text


def test_an_entry_larger_than_the_default_bound_is_kept_alone(home, monkeypatch):
    monkeypatch.setattr(conversion_cache, "DEFAULT_GIB", 1 / 1024)  # 1 MiB, the variable unset
    build, calls = counting({"w": torch.zeros(64 << 10, dtype=torch.uint8)})
    cached_weights(["small"], build)
    big = {"w": torch.arange(4 << 20, dtype=torch.int32).to(torch.uint8)}
    build_big, calls_big = counting(big)
    cached_weights(["big"], build_big)
    assert len(entries(home)) == 1  # the small one went
    assert torch.equal(cached_weights(["big"], build_big)["w"], big["w"]) and calls_big == [1]  # a hit: mapped
    # the next load writes its tokenizer file before it reads its weights: the big entry stays
    cached_text(["big", "tokenizer"], ".tokenizer.json", lambda: "{}")
    assert torch.equal(cached_weights(["big"], build_big)["w"], big["w"]) and calls_big == [1]


def test_a_first_load_that_cannot_map_its_entry_runs_on_the_converted_copy(home, monkeypatch, caplog):
    import errno
    import mmap

    built = {"w": torch.arange(10)}

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    assert cached_weights(["nomap"], lambda: dict(built))["w"] is built["w"]
    assert len(entries(home)) == 1 and "cannot map" in caplog.text


def test_no_entry_leaves_its_disk_nearly_full(home, monkeypatch, caplog):
    import shutil

    usage = shutil.disk_usage(home.parent)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=conversion_cache.DISK_SLACK + (1 << 20)))
    build, calls = counting({"w": torch.zeros(2 << 20, dtype=torch.uint8)})
    assert torch.equal(cached_weights(["big"], build)["w"], torch.zeros(2 << 20, dtype=torch.uint8))
    assert not entries(home) and "would leave" in caplog.text and "under 4 GiB free" in caplog.text


def test_an_old_entry_gives_way_when_the_disk_is_nearly_full(home, monkeypatch, caplog):
    import logging
    import shutil

    caplog.set_level(logging.INFO, logger=conversion_cache.__name__)
    cached_weights(["old"], lambda: {"w": torch.ones(2 << 20, dtype=torch.uint8)})
    cached_weights(["small"], lambda: {"w": torch.ones(64 << 10, dtype=torch.uint8)})
    old, small = sorted(entries(home), key=lambda p: p.stat().st_size, reverse=True)
    os.utime(old, ns=(0, 0))  # the least recently used
    usage, sizes = shutil.disk_usage(home.parent), {p: p.stat().st_size for p in (old, small)}

    def disk_usage(path):  # 1 MiB over the slack, plus what the cache's deletions freed
        return usage._replace(free=conversion_cache.DISK_SLACK + (1 << 20) + sum(
            size for p, size in sizes.items() if not p.exists()))

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    new = {"w": torch.arange(2 << 20).to(torch.uint8)}
    in_use = cached_weights(["old"], lambda: {})  # mapped: deleting it would free nothing while it is
    os.utime(old, ns=(0, 0))
    assert torch.equal(cached_weights(["new"], lambda: dict(new))["w"], new["w"])
    assert old.exists() and small.exists() and len(entries(home)) == 2  # not saved, and nothing deleted
    assert "even with the cache's unused entries deleted" in caplog.text
    del in_use
    assert torch.equal(cached_weights(["new"], lambda: dict(new))["w"], new["w"])
    assert not old.exists() and small.exists() and len(entries(home)) == 2  # the old one alone made room
    assert "to make room on its disk" in caplog.text

    caplog.clear()
    huge = {"w": torch.zeros(8 << 20, dtype=torch.uint8)}  # more than every other entry could free
    cached_weights(["huge"], lambda: dict(huge))
    assert len(entries(home)) == 2 and "even with the cache's unused entries deleted" in caplog.text  # none deleted


def test_the_bound_setting_is_checked(home, monkeypatch):
    from inferplug.errors import ProfileError

    monkeypatch.setenv(conversion_cache.SIZE_ENV, "lots")
    with pytest.raises(ProfileError, match="INFERPLUG_CONVERSION_CACHE_GIB='lots' is not a size in GiB.*0 to turn"):
        cached_weights(["x"], dict)
    monkeypatch.setenv(conversion_cache.SIZE_ENV, "0")
    build, calls = counting({"w": torch.ones(1)})
    cached_weights(["off"], build)
    assert not (home / "conversions").exists()
