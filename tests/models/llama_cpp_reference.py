"""llama.cpp as the second reference for every family: its own HF-to-GGUF converter (fetched by `make setup` into
.venv/llama.cpp from the llama-cpp-python sdist), its quantizer and its forward pass, through llama-cpp-python.

The converter's vocabulary step checks the tokenizer's pre-tokenizer against a list of real models' hashes; the tiny
models' byte-level BPE (tests/conftest.py) is in no list, so it is named for the byte-level pre-tokenizer it is
("gpt-2"). Nothing else of the converter is touched: tensors, names, norms and metadata are llama.cpp's own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

CONVERTER = Path(__file__).resolve().parents[2] / ".venv" / "llama.cpp"
_CONVERT = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def need_converter() -> Path:
    if not (CONVERTER / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not in {CONVERTER}: `make setup` fetches it "
                    "(tests/fixtures/fetch_llama_cpp_converter.py)")
    return CONVERTER


def need_llama_cpp():
    try:
        import llama_cpp
    except ImportError as exc:
        pytest.skip(f"llama-cpp-python is not installed ({exc}): `make setup` builds it")
    return llama_cpp


def convert(hf_dir: Path, out: Path) -> Path:
    """hf_dir as an F32 GGUF, by llama.cpp's convert_hf_to_gguf.py."""
    root = need_converter()
    # Qwen3.5's converter expects multi-token-prediction layers unless told the checkpoint has none (ours)
    no_mtp = ["--no-mtp"] if json.loads((hf_dir / "config.json").read_text())["model_type"].startswith("qwen3_5") else []
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(root), str(hf_dir), "--outtype", "f32", "--outfile",
                           str(out), *no_mtp], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"llama.cpp's converter failed on {hf_dir}:\n{done.stderr[-3000:]}")
    return out


def quantize(src: Path, out: Path, ftype: str) -> Path:
    """src quantized by llama.cpp's own quantizer (llama_model_quantize); ftype e.g. "Q8_0", "Q4_K_M"."""
    llama_cpp = need_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {src} to {ftype}")
    return out


def prompt_logprobs(gguf: Path, prompt: list[int]) -> torch.Tensor:
    """llama.cpp's log-probability of each prompt token after the first, given those before it: [len(prompt) - 1].
    Its KV cache is pinned to fp32 as the weights are (its default, fp16, moves Gemma 4's log-probs by up to 9e-3:
    its V rows come RMS-normed, about 1 in size, where fp16 keeps 11 bits)."""
    llama_cpp = need_llama_cpp()
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=512, n_batch=512, logits_all=True, n_threads=2, verbose=False,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    try:
        llm.eval(prompt)
        logits = torch.tensor(np.array(llm.scores[: len(prompt)]), dtype=torch.float32)
    finally:
        llm.close()
    return next_token_logprobs(logits, prompt)


def next_token_logprobs(logits: torch.Tensor, prompt: list[int]) -> torch.Tensor:
    """From logits [positions, vocab]: each next prompt token's log-probability."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
