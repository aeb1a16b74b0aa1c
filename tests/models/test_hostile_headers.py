"""Hostile GGUF and safetensors headers (issue 29): each is a ModelSourceError that names its problem, raised fast
(every file here fails in milliseconds; the bound only catches a hang), from the reader and from the facts `resolve`
reads."""

from __future__ import annotations

import json
import re
import struct
import threading
from pathlib import Path

import pytest

from inferplug.errors import ModelSourceError
from inferplug.models.gguf import MAX_ARRAY_ITEMS, clear_header_cache, read_gguf
from inferplug.models.safetensors_reader import MAX_RANK, read_header, safetensors_files
from tests.models.header_bytes import (
    ARRAY, LLAMA_KVS, STRING, U8, U32, gguf_file, gguf_kv, gguf_string, gguf_tensor_info, safetensors_file,
    small_gguf, small_safetensors,
)

BOUND_S = 10  # a hang bound, not a timing: main took 8 s on 40k dimensions, quadratically more beyond


def raised_within(call, bound: float = BOUND_S) -> BaseException | None:
    """The exception `call()` raised (None if it returned), failing if it is still running after `bound`."""
    outcome: list[BaseException | None] = []

    def run():
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test inspects whatever came out
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(bound)
    assert outcome, f"still running after {bound} s"
    return outcome[0]


def read_bytes(tmp_path: Path, raw: bytes, name: str = "m.gguf"):
    path = tmp_path / name
    path.write_bytes(raw)
    clear_header_cache()
    return read_gguf(path)


def assert_model_source_error(call, match: str) -> None:
    error = raised_within(call)
    assert isinstance(error, ModelSourceError), repr(error)
    assert re.search(match, str(error)), str(error)


def test_the_small_files_are_valid(tmp_path):
    gguf = read_bytes(tmp_path, small_gguf())
    assert gguf.tensors["token_embd.weight"].shape == (8, 32) and gguf.metadata["tokenizer.ggml.tokens"][2] == "a"
    path = tmp_path / "m.safetensors"
    path.write_bytes(small_safetensors())
    assert read_header(path)["a.weight"].shape == (2, 3)


HOSTILE_GGUF = {
    "40k dimensions": (gguf_file(LLAMA_KVS, [gguf_tensor_info("t", [2] * 40_000, 0, 0)]), "40000 dimensions"),
    "alignment 0": (gguf_file([*LLAMA_KVS, gguf_kv("general.alignment", U32, 0)], [gguf_tensor_info("t", [8], 0, 0)],
                              bytes(32)), "general.alignment is 0"),
    "alignment 48": (gguf_file([*LLAMA_KVS, gguf_kv("general.alignment", U32, 48)],
                               [gguf_tensor_info("t", [8], 0, 0)], bytes(64), alignment=48), "power of two"),
    "arrays nested 2000 deep": (gguf_file([*LLAMA_KVS, gguf_string("deep") + struct.pack("<I", ARRAY)
                                           + struct.pack("<IQ", ARRAY, 1) * 2000 + struct.pack("<IQ", U8, 0)], []),
                                "nests arrays deeper"),
    "a key 2^62 bytes long": (gguf_file([struct.pack("<Q", 1 << 62) + b"general"], []),
                              "bytes of a metadata key.*cannot fit"),
    "2^60 tokens": (gguf_file([*LLAMA_KVS, gguf_string("many") + struct.pack("<IIQ", ARRAY, STRING, 1 << 60)], []),
                    "items of many.*cannot fit"),
    "a vocabulary string 2^62 bytes long": (gguf_file([*LLAMA_KVS, gguf_string("words") + struct.pack("<IIQ", ARRAY,
                                                       STRING, 2) + gguf_string("a") + struct.pack("<Q", 1 << 62)], []),
                                            "a string of words of 4611686018427387904 bytes cannot fit"),
    "a vocabulary cut in a length": (gguf_file([*LLAMA_KVS, gguf_string("words") + struct.pack("<IIQ", ARRAY,
                                                STRING, 2) + gguf_string("a" * 20) + b"\x01"], [], alignment=1),
                                     "length of a string of words at byte .* needs 8 bytes"),
    "2^60 metadata entries": (gguf_file(LLAMA_KVS, [], kv_count=1 << 60), "metadata entries cannot fit"),
    "2^60 tensors": (gguf_file(LLAMA_KVS, [], tensor_count=1 << 60), "tensors cannot fit"),
    "a tensor past the end": (gguf_file(LLAMA_KVS, [gguf_tensor_info("t", [1 << 40], 0, 0)]), "past the end"),
    "an unaligned offset": (gguf_file(LLAMA_KVS, [gguf_tensor_info("t", [4], 0, 4)], bytes(64)), "not a multiple"),
    "partial Q8_0 blocks": (gguf_file(LLAMA_KVS, [gguf_tensor_info("t", [31], 8, 0)], bytes(64)), "whole Q8_0"),
    "a tensor named twice": (gguf_file(LLAMA_KVS, [gguf_tensor_info("t", [4], 0, 0)] * 2, bytes(32)), "twice"),
    "a truncated header": (small_gguf()[:300], "truncated or corrupt"),
    "an unknown value type": (gguf_file([*LLAMA_KVS, gguf_string("odd") + struct.pack("<I", 77)], []),
                              "unknown type 77"),
}


@pytest.mark.parametrize("case", list(HOSTILE_GGUF))
def test_a_hostile_gguf_header_is_a_model_source_error(tmp_path, case):
    raw, match = HOSTILE_GGUF[case]
    assert_model_source_error(lambda: read_bytes(tmp_path, raw), match)


def test_an_array_longer_than_the_cap_is_refused_before_it_becomes_a_list(tmp_path):
    count = MAX_ARRAY_ITEMS + 1
    raw = gguf_file([*LLAMA_KVS, gguf_string("big") + struct.pack("<IIQ", ARRAY, U8, count) + bytes(count)], [])
    assert_model_source_error(lambda: read_bytes(tmp_path, raw), r"at most 16777216")


@pytest.mark.parametrize("key, value_type, value, match", [
    ("llama.block_count", STRING, "many", "block_count is many, not a positive integer"),
    ("llama.attention.head_count", U32, 0, "head_count is 0"),
    ("llama.embedding_length", ARRAY, (U32, [1, 2]), r"embedding_length is \[1, 2\]"),
])
def test_nonsense_architecture_numbers_are_model_source_errors_in_the_facts_resolve_reads(
        tmp_path, monkeypatch, key, value_type, value, match):
    from inferplug.memory_plan import facts_from_file

    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    kvs = [kv for kv in LLAMA_KVS if gguf_string(key) not in kv] + [gguf_kv(key, value_type, value)]
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_file(kvs, [gguf_tensor_info("token_embd.weight", [32, 8], 0, 0)], bytes(1024)))
    clear_header_cache()
    assert_model_source_error(lambda: facts_from_file(path), match)


HOSTILE_SAFETENSORS = {
    "a header length past the file": (safetensors_file(b"{}", length=1 << 40), "header length"),
    "a list for a header": (safetensors_file([1, 2]), "JSON list, not an object"),
    "JSON nested 100k deep": (safetensors_file(b"[" * 100_000 + b"]" * 100_000), "not a readable"),
    "an unknown dtype": (safetensors_file({"t": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"x"),
                         "no known dtype"),
    "a negative dimension": (safetensors_file({"t": {"dtype": "F32", "shape": [-1, -1], "data_offsets": [0, 4]}},
                                              bytes(4)), "non-negative integers"),
    "too many dimensions": (safetensors_file({"t": {"dtype": "U8", "shape": [1] * (MAX_RANK + 1),
                                                    "data_offsets": [0, 1]}}, b"x"), f"at most {MAX_RANK}"),
    "string offsets": (safetensors_file({"t": {"dtype": "U8", "shape": [1], "data_offsets": ["0", "1"]}}, b"x"),
                       "data_offsets"),
    "bytes past the end": (safetensors_file({"t": {"dtype": "U8", "shape": [9], "data_offsets": [0, 9]}}, b"x"),
                           "do not fit"),
    "an entry that is a number": (safetensors_file({"t": 3}), "no known dtype"),
    "a 3-byte file": (b"\x01\x02\x03", "no header length"),
}


@pytest.mark.parametrize("case", list(HOSTILE_SAFETENSORS))
def test_a_hostile_safetensors_header_is_a_model_source_error(tmp_path, case):
    raw, match = HOSTILE_SAFETENSORS[case]
    path = tmp_path / "m.safetensors"
    path.write_bytes(raw)
    assert_model_source_error(lambda: read_header(path), match)


def index_dir(tmp_path: Path, shard: object) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "model-1.safetensors").write_bytes(small_safetensors())
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": shard}}))
    return model


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/model-1.safetensors", "..", 7,
                                   "model-1.bin"])
def test_an_index_names_only_plain_shard_files_in_the_model_dir(tmp_path, shard):
    (tmp_path / "outside.safetensors").write_bytes(small_safetensors())
    model = index_dir(tmp_path, shard)
    assert_model_source_error(lambda: safetensors_files(model), "no plain .safetensors file name")


def test_a_shard_symlinked_out_of_the_model_dir_is_refused(tmp_path):
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(small_safetensors())
    model = index_dir(tmp_path, "linked.safetensors")
    (model / "linked.safetensors").symlink_to(secret)
    assert_model_source_error(lambda: safetensors_files(model), "outside the model dir")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a.weight": "model-1.safetensors"}}))
    assert safetensors_files(model) == [model / "model-1.safetensors"]


def test_a_hugging_face_snapshot_links_into_its_own_blobs(tmp_path):
    repo = tmp_path / "models--o--r"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_bytes(small_safetensors())
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "model-1.safetensors").symlink_to("../../blobs/abc")
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    assert safetensors_files(snapshot) == [snapshot / "model-1.safetensors"]


def test_inferplug_resolve_of_a_hostile_gguf_exits_2_with_the_problem(tmp_path, monkeypatch, capsys):
    from inferplug.cli import main

    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE_GGUF["alignment 0"][0])
    clear_header_cache()
    assert main(["resolve", str(path)]) == 2
    assert "general.alignment is 0; it must be a power of two" in capsys.readouterr().err
