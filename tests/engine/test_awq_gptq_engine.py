"""AWQ / GPTQ checkpoints in the native engine: the CPU repack into Q4_1 blocks, the group layer that CUDA runs
(its torch path here), and greedy tokens on GPTQModel's fixture checkpoints against GPTQModel's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inferplug.models.loader import load_weights
from inferplug.quant.block_linear import BlockLinear
from inferplug.quant.checkpoint_layers import GroupInt4Linear, PermutedLinear, checkpoint_layer, q4_layer, q8_layer
from inferplug.quant.linear import quantize_model
from inferplug.types import Request
from tests.engine.engine_helpers import (greedy, make_engine, run_all, spy_fused_steps, tokens_and_logprobs, tokens_of,
                                         unfuse_steps)
from tests.quant_fixtures import INT4_NAMES, NAMES, fixture_dir, float_model, reference, reference_weights, unpacked

# Our decode steps round activations to int8 per 32 inputs (as llama.cpp does), the lm_head is a Q8_0 copy of the
# embedding, and each Q4_1 block's min is fp16: tokens may part from GPTQModel's only where its top two logits
# nearly tie. Measured on the fixtures (48 tokens each): awq-g64 parts twice, at gaps of 0.0012 (prompt 0, token 6)
# and 0.027 (prompt 1, token 15) with logits of std ~0.95; the 4-bit GPTQ fixtures never part; gptq-8bit (Q8_0
# blocks, its weights exact) parts once, at a gap of 0.025 (prompt 2, token 10): int8 activations and head alone.
# A gap under 5% of the logits' std is what that rounding explains.
TIE = 0.05


@pytest.mark.parametrize("name", NAMES)
def test_block_repack_holds_the_checkpoint_weights(cpu_kernel_ops, name):
    """4 bits in Q4_1: scale exact; the min -s*z rounded to fp16, off by at most half an fp16 ulp of s*z. 8 bits
    (symmetric) in Q8_0: exact."""
    for quant in unpacked(name).values():
        order = quant.input_order()
        quant = quant if order is None else quant.permuted(order)
        exact = quant.dequantized()
        if quant.bits == 8:
            assert torch.equal(q8_layer(quant).dequantized(), exact)
            continue
        bound = (quant.scales.float() * quant.zeros.float()).abs().amax() * 2.0**-11
        assert (q4_layer(quant).dequantized() - exact).abs().max() <= bound


@pytest.mark.parametrize("name", NAMES)
def test_loaded_layers_equal_gptqmodels_weights(cpu_kernel_ops, name):
    """What load_weights gives the engine, dequantized, against GPTQModel's dequantization (layer 0)."""
    weights = load_weights(fixture_dir(name), torch.float32, "cpu", declared_format=name.split("-")[0])
    for module, expected in reference_weights(name).items():
        layer = weights[module]
        assert isinstance(layer, (BlockLinear, PermutedLinear))
        torch.testing.assert_close(layer.dequantized(), expected, rtol=0, atol=expected.abs().max().item() * 2**-10)


@pytest.mark.parametrize("name", INT4_NAMES)
def test_group_layer_runs_the_exact_weights(name, monkeypatch):
    """GroupInt4Linear (CUDA's layer; on a CPU without the kernels its torch reference) keeps the checkpoint's
    groups exactly."""
    from inferplug.kernels import cpu as cpu_kernels

    monkeypatch.setattr(cpu_kernels, "ops", lambda: None)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0))
    for quant in unpacked(name).values():
        layer = checkpoint_layer(quant, "cpu")
        inner = layer.inner if isinstance(layer, PermutedLinear) else layer
        assert isinstance(inner, GroupInt4Linear)
        assert torch.equal(layer.dequantized(), quant.dequantized())
        if quant.codes.shape[1] == 128:
            torch.testing.assert_close(layer(x), F.linear(x, quant.dequantized()), rtol=1e-5, atol=1e-5)


def test_8bit_gptq_needs_the_cpu_kernels(monkeypatch):
    from inferplug.errors import ProfileError
    from inferplug.kernels import cpu as cpu_kernels

    monkeypatch.setattr(cpu_kernels, "ops", lambda: None)
    with pytest.raises(ProfileError, match="8-bit GPTQ runs on inferplug's CPU kernels only.*4-bit"):
        checkpoint_layer(next(iter(unpacked("gptq-8bit-actorder-g32").values())), "cpu")


def run_greedy(engine, ref: dict) -> list[list[int]]:
    requests = [Request(prompt=p, params=greedy(len(t)), request_id=f"r{i}")
                for i, (p, t) in enumerate(zip(ref["prompts"], ref["greedy_dequantized_fp32"]))]
    events = run_all(engine, requests)
    return [tokens_of(events[f"r{i}"]) for i in range(len(requests))]


@pytest.mark.parametrize("name", NAMES)
def test_exact_weights_give_gptqmodels_tokens(cpu_kernel_ops, name):
    """The loaded model with its layers dequantized to float: every token GPTQModel's own generation gives (its
    fp16 kernel and its dequantized weights in fp32 agree on these prompts), so loading and fusing are right."""
    engine = make_engine(fixture_dir(name))
    for layer in engine.runner.model.layers:
        for part in ("qkv", "o", "gate_up", "down"):
            setattr(layer, part, getattr(layer, part).dequantized().contiguous())
    ref = reference(name)
    assert run_greedy(engine, ref) == ref["greedy_dequantized_fp32"] == ref["greedy_gptqmodel_fp16"]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_match_gptqmodel(cpu_kernel_ops, name):
    """The engine as it runs a checkpoint (Q4_1 kernels, int8 activations, Q8_0 head): GPTQModel's tokens up to a
    near-tie of its logits, if any (then the continuations part)."""
    engine = make_engine(fixture_dir(name))
    quantize_model(engine.runner.model, name.split("-")[0])  # the lm_head, as the native backend does
    ref = reference(name)
    model = None
    for prompt, ours, expected in zip(ref["prompts"], run_greedy(engine, ref), ref["greedy_dequantized_fp32"]):
        split = next((j for j, (a, b) in enumerate(zip(ours, expected)) if a != b), None)
        if split is None:
            continue
        model = model or float_model(name)
        logits = model(torch.tensor([prompt + expected[:split]])).logits[0, -1]
        gap = (logits[expected[split]] - logits[ours[split]]).item()
        assert 0 <= gap < TIE * logits.std().item(), (split, gap, ours, expected)


def test_fused_group_layers_and_act_order_mismatch(monkeypatch):
    """q/k/v fused as one GroupInt4Linear hold each part's rows; parts permuted differently cannot share an input."""
    from inferplug.errors import ProfileError
    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.quant.checkpoint_layers import fuse_rows

    monkeypatch.setattr(cpu_kernels, "ops", lambda: None)
    quants = unpacked("gptq-sym-g64")
    parts = [checkpoint_layer(quants[f"model.layers.0.self_attn.{n}_proj.weight"], "cpu") for n in "qkv"]
    fused = fuse_rows(parts)
    assert torch.equal(fused.dequantized(), torch.cat([p.dequantized() for p in parts]))
    act_order = unpacked("gptq-actorder-g32")
    q = checkpoint_layer(act_order["model.layers.0.self_attn.q_proj.weight"], "cpu")
    o = checkpoint_layer(act_order["model.layers.0.self_attn.o_proj.weight"], "cpu")
    assert isinstance(q, PermutedLinear) and isinstance(o, PermutedLinear)
    with pytest.raises(ProfileError, match="different act-order permutations.*desc_act = false"):
        fuse_rows([q, o])


@pytest.mark.parametrize("name", ["gptq-actorder-g32", "gptq-8bit-actorder-g32"])
def test_act_order_decodes_in_one_kernel_call_like_the_layer_by_layer_path(cpu_kernel_ops, name, monkeypatch):
    """GPTQ act-order layers take decode_layers' fused step (q/k/v, o and gate/up inputs gathered in the call;
    down's order folded into gate/up's rows at load): tokens and logprobs bit for bit the layer-by-layer path's."""
    def generate():
        engine = make_engine(fixture_dir(name))
        quantize_model(engine.runner.model, "gptq")
        layer = engine.runner.model.layers[0]
        assert all(isinstance(w, PermutedLinear) for w in (layer.qkv, layer.o, layer.gate_up))
        assert isinstance(layer.down, BlockLinear)  # its order lives in gate_up's rows
        ref = reference(name)
        requests = [Request(prompt=p, params=greedy(12, logprobs=3), request_id=f"r{i}") for i, p in enumerate(ref["prompts"])]
        return tokens_and_logprobs(run_all(engine, requests[:1], {2: requests[1:]}))

    fused_steps = spy_fused_steps(monkeypatch)
    fused = generate()
    assert any(fused_steps) and not all(fused_steps), "decode-only steps run fused, steps with prefill do not"
    unfuse_steps(monkeypatch)
    assert generate() == fused


@pytest.mark.parametrize("name", NAMES)
def test_the_plan_counts_the_layers_bits_as_loaded(cpu_kernel_ops, name, tmp_path, monkeypatch):
    """`resolve` reads the checkpoint's bits and group size: its layer bits are the loaded layers' (Q4_1 blocks at 5
    bits for groups of 32 or 64, Q8_0 at 8.5 for 8-bit GPTQ; groups of 128 share a scale: bench/real_size.py's 7B)."""
    from inferplug.hardware import probe
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve

    monkeypatch.setenv("INFERPLUG_HOME", str(tmp_path / "home"))  # no facts memo from another version
    profile = tmp_path / "checkpoint.toml"
    profile.write_text(f'backend = "native"\n[model]\npath = "{fixture_dir(name)}"\n'
                       f'[quantization]\nformat = "{name.split("-")[0]}"\n[cache]\nmemory = "16MiB"\n')
    reasons = " ".join(resolve(load_profile(str(profile)), probe()).reasons)
    layers = [getattr(w, "inner", w) for layer in make_engine(fixture_dir(name)).runner.model.layers
              for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]  # an act-order layer's blocks (its order aside)
    loaded_bits = 8 * sum(w.nbytes() for w in layers) / sum(w.in_features * w.out_features for w in layers)
    assert f"({loaded_bits:.3g} bits)" in reasons, (loaded_bits, reasons)
