"""AWQ / GPTQ load: seconds and peak memory of a first load (streamed conversion) and a cached one (the conversion
cache's mapping), each in a fresh process, so VmHWM is that load's own peak.

Peak memory is VmHWM minus the RSS just before load_weights (Python, torch and the CPU kernels already loaded),
next to the size of what the load returns: their gap is the load's own overhead. CPU seconds (user + sys) are
quoted beside wall seconds because the host may be shared. A random 7B-geometry AWQ checkpoint to run it on is the
one bench/real_size.py writes (inferplug/benchmark/random_models.py; ~3.9 GB):

    .venv/bin/python bench/real_size.py --formats awq --engines inferplug      # writes /work/tmp-realsize/...
    .venv/bin/python bench/awq_load_memory.py /work/tmp-realsize/random-llama-32L-awq-g128 --json awq-load.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from inferplug.benchmark.machine import memory_bytes


def measure_load(model_dir: str) -> dict:
    """One load_weights in this process: its seconds, and its peak memory above what came before it."""
    import resource

    import torch

    from inferplug.kernels import cpu as cpu_kernels
    from inferplug.models.loader import load_weights

    cpu_kernels.ops()
    before, usage = memory_bytes("VmRSS")["VmRSS"], resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    weights = load_weights(Path(model_dir), torch.float32, "cpu")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    size = sum(w.nbytes if isinstance(w, torch.Tensor) else w.nbytes() for w in weights.values())
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime,
            "peak_bytes": memory_bytes("VmHWM")["VmHWM"] - before, "loaded_bytes": size, "baseline_bytes": before}


def in_child(model_dir: Path, home: Path, **env: str) -> dict:
    result = subprocess.run([sys.executable, __file__, "--child", str(model_dir)], capture_output=True, text=True,
                            env={**os.environ, "INFERPLUG_HOME": str(home), **env}, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--child", action="store_true", help="measure one load in this process, print JSON")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure_load(str(args.model_dir))))
        return
    with tempfile.TemporaryDirectory(prefix="inferplug-awq-load-") as home:
        rows = {"first": in_child(args.model_dir, Path(home)), "cached": in_child(args.model_dir, Path(home))}
    gib = 1 << 30
    print(f"{'load':8} {'wall s':>8} {'cpu s':>8} {'peak GiB':>9} {'loaded GiB':>11}")
    for name, row in rows.items():
        print(f"{name:8} {row['wall_s']:8.1f} {row['cpu_s']:8.1f} {row['peak_bytes'] / gib:9.2f} "
              f"{row['loaded_bytes'] / gib:11.2f}")
    if args.json:
        args.json.write_text(json.dumps({"model_dir": str(args.model_dir), **rows}, indent=2))


if __name__ == "__main__":
    main()
