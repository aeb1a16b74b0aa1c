"""Run in a fresh process by test_gguf_real_size.py: load a profile through the offline API, serve one request, read
every weight once, and print the peak RSS beside what `resolve` promised, as JSON on the last line. A hybrid model's plan also holds its
prefix cache's DeltaNet state snapshots, which one short request never takes: their bytes are printed apart."""

from __future__ import annotations

import json
import sys


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def read_every_tensor(obj, seen: set[int] | None = None, depth: int = 8) -> None:
    """Reads each tensor held by obj, its lists, dicts and attributes, a few levels down (a layer's blocks, scales
    and biases, a module's buffers; an MoE's stacked experts)."""
    import torch

    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        torch.count_nonzero(obj)
    elif isinstance(obj, (list, tuple, dict)):
        for item in obj.values() if isinstance(obj, dict) else obj:
            read_every_tensor(item, seen, depth - 1)
    elif hasattr(obj, "__dict__"):
        for item in vars(obj).values():
            read_every_tensor(item, seen, depth - 1)


def main(profile_path: str) -> None:
    import torch

    from inferplug.hardware import probe
    from inferplug.llm import LLM
    from inferplug.profile import load_profile
    from inferplug.quant.base import WeightOnlyLinear
    from inferplug.resolver import resolve
    from inferplug.types import SamplingParams

    memory = resolve(load_profile(profile_path), probe()).memory
    llm = LLM(profile_path)
    llm.generate("The weights of a large model " * 8, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    model = llm.engine.runner.model
    snapshots = llm.engine.snapshots
    untaken = 0 if snapshots is None else \
        (snapshots.capacity - len(snapshots.snapshots)) * model.config.state_bytes_per_sequence(4)
    matrices = [model.embed, model.lm_head, *(w for layer in model.layers for w in layer.linears())]  # experts too
    # Every weight read once, as a long run reads them: a load maps its conversion-cache entry, whose pages become
    # resident as they are used (the embedding's rows a prompt names, an MoE's experts a token picks), and the plan
    # promises what a running engine holds.
    read_every_tensor(matrices)
    print(json.dumps({"peak_rss": peak_rss_bytes(), "planned": memory.promised_bytes, "untaken_snapshots": untaken,
                      "float_matrices": sum(isinstance(m, torch.Tensor) for m in matrices),
                      "layers": sum(isinstance(m, WeightOnlyLinear) for m in matrices)}))


if __name__ == "__main__":
    main(sys.argv[1])
