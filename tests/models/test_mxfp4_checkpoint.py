"""gpt-oss as its HF release ships: the experts in MXFP4 (`*_blocks` / `*_scales`, quant_method "mxfp4"), the rest
float. The tiny gpt-oss's experts are written so here (E8M0 exponents and E2M1 codes chosen as llama.cpp's
quantize_row_mxfp4_ref chooses them, in HF's byte order). Two readers nobody here wrote check the load: llama.cpp's
converter repacks the same file into the GGUF blocks ours must equal byte for byte, and HF transformers dequantizes
it (integrations/mxfp4.py) into the model our logprobs must match."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferplug.models.loader import load_weights, read_config
from inferplug.quant.block_linear import MXFP4Linear
from tests.conftest import _save_tiny
from tests.engine.engine_helpers import prompts_of
from tests.models import llama_cpp_reference as llama_cpp
from tests.models.test_families import BOUND, LONG, VOCAB, engine_logprobs

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# transformers' own list for gpt-oss's release: everything but the experts stays float
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def pack_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [..., rows, cols] -> HF's blocks (uint8 [..., rows, cols / 32, 16], weight 2i in byte i's low nibble)
    and scales (uint8 [..., rows, cols / 32], E8M0): the exponent floor(log2(amax)) - 2, each weight the nearest
    E2M1 value, the first on a tie (llama.cpp's quantize_row_mxfp4_ref)."""
    groups = weight.float().reshape(*weight.shape[:-1], -1, 32)
    exponent = torch.floor(torch.log2(groups.abs().amax(dim=-1).clamp(min=2.0**-126))) - 2
    codes = (groups[..., None] / torch.exp2(exponent)[..., None, None] - E2M1).abs().argmin(dim=-1).to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent + 127).to(torch.uint8)


@pytest.fixture(scope="module")
def mxfp4_gpt_oss_dir(tmp_path_factory) -> Path:
    """The tiny gpt-oss with its experts in MXFP4, as the release lays them out: [experts, rows out, ...] with
    gate_up's rows interleaved (the float checkpoint's [experts, in, out] transposed)."""
    float_dir = _save_tiny("gpt_oss", tmp_path_factory.mktemp("tiny-gpt_oss-float"))
    out = tmp_path_factory.mktemp("tiny-gpt_oss-mxfp4")
    for path in float_dir.iterdir():
        if path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    tensors = {}
    for name, tensor in load_file(float_dir / "model.safetensors").items():
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = pack_mxfp4(tensor.transpose(1, 2))
        else:
            tensors[name] = tensor
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_the_experts_load_in_the_bits_llama_cpps_converter_gives_them(cpu_kernel_ops, mxfp4_gpt_oss_dir, tmp_path):
    gguf = llama_cpp.convert(mxfp4_gpt_oss_dir, tmp_path / "gpt_oss.gguf")
    from_hf = load_weights(mxfp4_gpt_oss_dir, torch.float32)
    from_gguf = load_weights(gguf, torch.float32, gguf_layers="gguf")
    experts = [name for name in from_hf if ".experts." in name and name.endswith("proj.weight")]
    assert len(experts) == 4 * 8 * 3
    for name in experts:
        assert isinstance(from_hf[name], MXFP4Linear), name  # no float copy
        if ".down_proj." in name:
            assert torch.equal(from_hf[name].blocks, from_gguf[name].blocks), name
        elif ".gate_proj." in name:  # a GGUF's block layers come with each expert's gate and up rows fused
            up = from_hf[name.replace(".gate_proj.", ".up_proj.")]
            fused = from_gguf[name.replace(".gate_proj.", ".gate_up_proj.")]
            assert torch.equal(torch.cat([from_hf[name].blocks, up.blocks]), fused.blocks), name


def test_an_mxfp4_checkpoint_runs_as_hf_dequantizes_it(cpu_kernel_ops, mxfp4_gpt_oss_dir):
    import transformers

    prompt = prompts_of([LONG], vocab=VOCAB, seed=4)[0]
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        mxfp4_gpt_oss_dir, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    with torch.no_grad():
        reference = llama_cpp.next_token_logprobs(hf(torch.tensor([prompt])).logits[0], prompt)
    for attention in ("torch", "cpu-kernels"):
        assert (engine_logprobs(mxfp4_gpt_oss_dir, prompt, attention=attention) - reference).abs().max() < BOUND


def test_the_facts_name_the_mxfp4_experts(mxfp4_gpt_oss_dir):
    from inferplug.memory_plan import facts_from_file

    config = read_config(mxfp4_gpt_oss_dir)
    facts = facts_from_file(mxfp4_gpt_oss_dir)
    assert facts.mxfp4_parameters == 4 * 8 * 3 * config.hidden_size * config.intermediate_size
    assert facts.num_experts == config.num_experts == 8  # what the resolver's MoE defaults read


def test_the_plan_counts_the_experts_in_their_blocks_where_the_kernels_run_them():
    """The experts at MXFP4Linear's 4.5 bits a weight, the rest as a float checkpoint's (here fp16 linears beside an
    fp32 embedding and an fp16 head), on the CPU and on a GPU (the Triton grouped GEMM reads the blocks); dequantized
    where the CPU kernels cannot be built (MXFP4Linear needs them); one rank only."""
    import dataclasses

    from inferplug.errors import ResolveError
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve
    from tests.resolver_hardware import A100_80, SMOLLM2, cpu, with_gpus

    embed, experts = 49152 * 576, 60_000_000
    facts = dataclasses.replace(SMOLLM2, vocab_size=49152, hidden_size=576, tie_word_embeddings=True,
                                mxfp4_parameters=experts)
    profile = load_profile("smollm2-135m")
    profile.quantization.format = "none"
    plan = resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts)
    rest = (SMOLLM2.num_parameters - experts - embed) * 2 + embed * 4 + embed * 2
    assert plan.memory.weights_bytes == pytest.approx(rest + experts * 4.5 / 8, abs=1)
    assert any("the experts (45% of the weights) in MXFP4 blocks as stored" in r for r in plan.reasons)
    unkernelled = resolve(profile, cpu(flags=("avx2", "fma")), facts)  # no F16C: fp32, every expert dequantized
    assert unkernelled.memory.weights_bytes == SMOLLM2.num_parameters * 4
    on_gpu = resolve(profile, dataclasses.replace(with_gpus(A100_80), cpu_flags=frozenset({"avx2", "fma", "f16c"})),
                     facts)  # the Triton grouped GEMM reads the blocks (kernels/moe_gemm.py)
    assert any("the experts (45% of the weights) in MXFP4 blocks as stored" in r for r in on_gpu.reasons)
    profile.parallel.tensor_parallel_size = 3  # divides SmolLM2's 9 heads and 3 KV heads
    with pytest.raises(ResolveError, match="does not split an HF checkpoint's MXFP4 experts"):
        resolve(profile, cpu(flags=("avx2", "fma", "f16c")), facts)


def test_a_damaged_pair_names_the_tensor_and_the_fix(mxfp4_gpt_oss_dir, tmp_path):
    from inferplug.errors import ModelSourceError

    damaged = tmp_path / "damaged"
    shutil.copytree(mxfp4_gpt_oss_dir, damaged)
    tensors = load_file(damaged / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.down_proj_scales"]
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelSourceError, match=r"layers\.2\.mlp\.experts\.down_proj_blocks has no .*_scales.*re-download"):
        load_weights(damaged, torch.float32)


def test_the_release_dir_runs_as_it_is_through_the_offline_api(cpu_kernel_ops, mxfp4_gpt_oss_dir):
    """No TOML: the directory's implicit profile (format "none"), resolve's plan and the load, greedy as HF's."""
    import transformers

    from inferplug.hardware import probe
    from inferplug.llm import LLM
    from inferplug.model_file import implicit_profile_data
    from inferplug.profile import load_profile
    from inferplug.resolver import resolve
    from inferplug.types import SamplingParams
    from tests.engine.engine_helpers import hf_generate

    assert implicit_profile_data(str(mxfp4_gpt_oss_dir))["quantization"] == {"format": "none"}
    plan = resolve(load_profile(str(mxfp4_gpt_oss_dir)), probe())
    assert "in MXFP4 blocks as stored" in " ".join(plan.reasons)
    prompt = prompts_of([20], vocab=VOCAB, seed=5)[0]
    out = LLM(str(mxfp4_gpt_oss_dir)).generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        mxfp4_gpt_oss_dir, dtype=torch.float32, quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    assert out[0].outputs[0].token_ids == hf_generate(hf, prompt, 8)
