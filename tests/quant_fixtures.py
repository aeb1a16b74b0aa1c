"""The AWQ / GPTQ fixture checkpoints GPTQModel made (tests/fixtures/make_quant_fixtures.py) and its references."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "quant"
NAMES = ("awq-g64", "gptq-actorder-g32", "gptq-sym-g64", "gptq-8bit-actorder-g32")
INT4_NAMES = NAMES[:3]


def fixture_dir(name: str) -> Path:
    return FIXTURES / name


def reference(name: str) -> dict:
    return json.loads((FIXTURES / name / "reference.json").read_text())


def reference_weights(name: str) -> dict:
    from safetensors.torch import load_file

    return load_file(FIXTURES / name / "reference.safetensors")


def unpacked(name: str) -> dict:
    """{'<module>.weight': GroupQuant} of a fixture, unpacked by quant/group_int4.py."""
    from safetensors.torch import load_file

    from inferplug.models.quant_checkpoint import read_quant_spec
    from inferplug.quant.group_int4 import unpack_awq, unpack_gptq

    spec = read_quant_spec(fixture_dir(name))
    tensors = load_file(fixture_dir(name) / "model.safetensors")
    out = {}
    for module in {n.rsplit(".", 1)[0] for n in tensors if n.endswith(".qweight")}:
        packed = [tensors[f"{module}.{p}"] for p in ("qweight", "qzeros", "scales")]
        if spec.method == "awq":
            out[f"{module}.weight"] = unpack_awq(*packed, spec.group_size)
        else:
            out[f"{module}.weight"] = unpack_gptq(*packed, tensors.get(f"{module}.g_idx"), spec.group_size,
                                                  spec.zero_offset, spec.bits)
    return out


def float_model(name: str):
    """transformers' Llama in fp32 over the fixture's exactly dequantized weights: the logits greedy ties are
    judged by."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((FIXTURES / name / "config.json").read_text())
    config.pop("quantization_config")
    model = LlamaForCausalLM(LlamaConfig(**config)).float().eval()
    packed = ("qweight", "qzeros", "scales", "g_idx")
    state = {n: t.float() for n, t in load_file(FIXTURES / name / "model.safetensors").items()
             if n.rsplit(".", 1)[1] not in packed}
    state.update({n: q.dequantized() for n, q in unpacked(name).items()})
    model.load_state_dict(state, strict=False)  # lm_head: tied to the embedding
    return model.requires_grad_(False)


def editable_copy(name: str, tmp_path: Path) -> Path:
    """A copy of a fixture to damage (its checkpoint files only)."""
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out, ignore=shutil.ignore_patterns("reference.*"))
    return out
