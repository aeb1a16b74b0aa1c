"""OpenVINO GenAI as a bench peer. It runs in a venv of its own (openvino-genai pins its own numpy and transformers),
so bench/prefill.py (its OpenVINOPeer) starts this file under that venv's python and talks to it over pipes: one
JSON line a request ({"ids": [...], "max_tokens": n}), one JSON line back with each token's time from the generate
call's start (so the pipe's cost is not timed) and the prompt tokens OpenVINO counted. The venv and the model:

    python3 -m venv /work/venv-ov && /work/venv-ov/bin/pip install torch==2.13.0     # the CPU wheel first
    /work/venv-ov/bin/pip install -c <(echo torch==2.13.0) 'optimum-intel[openvino]' openvino-genai
    /work/venv-ov/bin/pip uninstall -y torchvision   # PyPI's build, for another torch: the export dies on it
    /work/venv-ov/bin/optimum-cli export openvino -m HF_CHECKPOINT --task text-generation-with-past \
        --weight-format int4 --group-size 32 --ratio 1.0 /work/tmp/smollm2-ov-int4

The pipeline is LLMPipeline(model, "CPU", INFERENCE_NUM_THREADS=threads) with its defaults otherwise, as a user
would run it; prompts go in as token ids (TokenizedInputs), so every engine gets the same tokens.
"""

from __future__ import annotations

import json
import os
import sys
import time


def serve(model_dir: str, threads: int) -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything OpenVINO prints goes to stderr; the replies' pipe carries JSON only
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    times: list[float] = []

    class Clock(genai.StreamerBase):  # called once per generated token (a list of them when several come at once)
        def write(self, token):
            times.extend([time.perf_counter()] * (len(token) if isinstance(token, list) else 1))
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    pipe = genai.LLMPipeline(model_dir, "CPU", INFERENCE_NUM_THREADS=threads)
    reply({"openvino": ov.__version__, "openvino_genai": genai.__version__})
    for line in sys.stdin:
        request = json.loads(line)
        ids = np.array([request["ids"]], dtype=np.int64)
        n = request["max_tokens"]
        config = genai.GenerationConfig(max_new_tokens=n, min_new_tokens=n, ignore_eos=True, do_sample=False)
        times.clear()
        start = time.perf_counter()
        result = pipe.generate(genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config, Clock())
        reply({"times": [t - start for t in times], "prompt_tokens": result.perf_metrics.get_num_input_tokens()})


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
