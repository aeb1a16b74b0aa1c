"""AWQ / GPTQ unpacking (quant/group_int4.py) against GPTQModel's own dequantization, bit for bit, and the bad
checkpoints the loader (models/quant_checkpoint.py) must refuse at load with a ProfileError naming the fix."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferplug.errors import ProfileError
from inferplug.models.loader import load_weights
from inferplug.models.quant_checkpoint import quantized_layers, read_quant_spec
from inferplug.quant.group_int4 import unpack_awq, unpack_gptq
from tests.quant_fixtures import NAMES, editable_copy, fixture_dir, reference_weights, unpacked


@pytest.mark.parametrize("name", NAMES)
def test_unpacking_equals_gptqmodels_dequantization(name):
    ours, theirs = unpacked(name), reference_weights(name)
    assert theirs and set(theirs) <= set(ours)
    for module, weight in theirs.items():
        assert torch.equal(ours[module].dequantized(), weight), module


def test_fixtures_cover_act_order_and_symmetric():
    act_order = unpacked("gptq-actorder-g32")
    assert any(q.input_order() is not None for q in act_order.values())  # g_idx really is not i // G
    symmetric = unpacked("gptq-sym-g64")
    assert all(bool((q.zeros == 8).all()) for q in symmetric.values())
    assert not all(bool((q.zeros == 8).all()) for q in unpacked("awq-g64").values())
    eight_bit = unpacked("gptq-8bit-actorder-g32")
    assert all(q.bits == 8 and bool((q.zeros == 128).all()) for q in eight_bit.values())
    assert any(q.input_order() is not None for q in eight_bit.values())
    assert max(int(q.codes.max()) for q in eight_bit.values()) > 15  # really 8-bit codes


@pytest.mark.parametrize("name", NAMES)
def test_act_order_permutation_keeps_the_weight(name):
    for quant in unpacked(name).values():
        order = quant.input_order()
        if order is not None:
            assert torch.equal(quant.permuted(order).dequantized(), quant.dequantized()[:, order])


def test_awq_column_order_is_autoawqs():
    """AutoAWQ packs columns [0, 2, 4, 6, 1, 3, 5, 7] into a word's nibbles 0..7."""
    codes = torch.arange(8, dtype=torch.int32)  # column c holds code c
    word = sum(int(codes[c]) << (4 * i) for i, c in enumerate((0, 2, 4, 6, 1, 3, 5, 7)))
    qweight = torch.tensor([[word - (1 << 32) if word >= 1 << 31 else word]] * 32, dtype=torch.int32)
    quant = unpack_awq(qweight, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, 8, dtype=torch.float16), 32)
    assert quant.codes[:, 0].tolist() == list(range(8))


def test_gptq_8bit_words_hold_four_bytes_lowest_first():
    word = 0x80FF0102 - (1 << 32)  # bytes, lowest first: 0x02, 0x01, 0xFF, 0x80
    qweight = torch.full((8, 4), word, dtype=torch.int32)  # 32 inputs, 4 outputs
    qzeros = torch.full((1, 1), 0x7F7F7F7F, dtype=torch.int32)  # stored 127 = symmetric zero 128 in v1
    quant = unpack_gptq(qweight, qzeros, torch.ones(1, 4, dtype=torch.float16), None, 32, zero_offset=1, bits=8)
    assert quant.codes[0, :4].tolist() == [2, 1, 255, 128] and (quant.zeros == 128).all()
    assert quant.dequantized()[0, :4].tolist() == [-126, -127, 127, 0]


def test_gptq_v1_zero_offset():
    qweight = torch.zeros(4, 8, dtype=torch.int32)  # 32 inputs, 8 outputs, codes 0
    qzeros = torch.full((1, 1), 0x77777777, dtype=torch.int32)  # stored 7 = symmetric zero 8 in v1
    scales = torch.ones(1, 8, dtype=torch.float16)
    assert (unpack_gptq(qweight, qzeros, scales, None, 32, zero_offset=1).dequantized() == -8).all()
    assert (unpack_gptq(qweight, qzeros, scales, None, 32, zero_offset=0).dequantized() == -7).all()


# --- bad checkpoints: a ProfileError at load that names the fix ---------------------------------------------
def rewrite_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(config))


def rewrite_tensors(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_profile_format_must_match_the_checkpoint():
    with pytest.raises(ProfileError, match="quantization.format = 'awq'.*holds a GPTQ.*set quantization.format = 'gptq'"):
        load_weights(fixture_dir("gptq-sym-g64"), torch.float32, declared_format="awq")
    with pytest.raises(ProfileError, match="holds a AWQ|holds an? AWQ"):
        load_weights(fixture_dir("awq-g64"), torch.float32, declared_format="none")


@pytest.mark.parametrize("changes,match", [
    ({"bits": 8}, "8 bits is not supported.*4-bit variant"),
    ({"bits": 3}, "3 bits is not supported"),
    ({"group_size": 16}, "group_size 16 is not supported.*32, 64, 128"),
    ({"version": "gemv", "format": "gemv", "checkpoint_format": "gemv"}, "GEMM packing"),
    ({"quant_method": "fp8"}, "quantized with 'fp8'.*use an unquantized, GGUF, AWQ or GPTQ model"),
])
def test_unsupported_settings(tmp_path, changes, match):
    path = editable_copy("awq-g64", tmp_path)
    rewrite_config(path, **changes)
    with pytest.raises(ProfileError, match=match):
        load_weights(path, torch.float32)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.pop("model.layers.0.self_attn.q_proj.scales"), "has qweight but no scales.*re-download"),
    (lambda t: t.pop("model.layers.1.mlp.down_proj.qzeros"), "no qzeros"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.qzeros": t["model.layers.0.mlp.up_proj.qzeros"][:, :-1].contiguous()}),
     "qzeros has shape .*expected"),
    (lambda t: t.update({"model.layers.0.mlp.up_proj.scales": t["model.layers.0.mlp.up_proj.scales"][:-1].contiguous()}),
     "scales has shape"),
])
def test_missing_or_misshapen_tensors(tmp_path, edit, match):
    path = editable_copy("gptq-actorder-g32", tmp_path)
    rewrite_tensors(path, edit)
    with pytest.raises(ProfileError, match=match):
        load_weights(path, torch.float32)


def test_8bit_gptq_must_be_symmetric(tmp_path):
    path = editable_copy("gptq-8bit-actorder-g32", tmp_path)

    def asymmetric(tensors):
        tensors["model.layers.1.self_attn.k_proj.qzeros"][0, 0] = 0x7F7F7F70  # one zero 113
    rewrite_tensors(path, asymmetric)
    with pytest.raises(ProfileError, match="8-bit GPTQ checkpoint is asymmetric.*sym = true"):
        load_weights(path, torch.float32)


def test_g_idx_must_be_a_permutation_of_groups(tmp_path):
    path = editable_copy("gptq-actorder-g32", tmp_path)

    def lopsided(tensors):
        g_idx = tensors["model.layers.0.self_attn.o_proj.g_idx"]
        g_idx[:40] = 0  # group 0 gets more than 32 inputs
    rewrite_tensors(path, lopsided)
    with pytest.raises(ProfileError, match="g_idx is not a permutation of 4 groups of 32"):
        load_weights(path, torch.float32)


def test_checkpoint_without_qweights(tmp_path):
    path = editable_copy("awq-g64", tmp_path)
    tensors = {n: t for n, t in load_file(path / "model.safetensors").items() if "layers" not in n}
    with pytest.raises(ProfileError, match="no qweight tensors"):
        quantized_layers(tensors, read_quant_spec(path), "cpu", torch.float32)
