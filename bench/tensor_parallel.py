"""Tensor parallel TP=2 against TP=1 on the same CPU cores, same run: what the all-reduces cost per step.

One host cannot show a speed-up (both ranks share its cores), so this reports the overhead: the median decode
step at each batch size, and on rank 0 the time spent inside the collectives (2 all-reduces a layer, one for
the vocabulary-parallel embedding, one gather of the logits) and in sending the step's rows to the other rank
(a pipe; bytes per step given). The model is SmolLM2-135M's shape with 8 heads / 4 KV heads (SmolLM2's 9 / 3
do not split in two) and random weights, fp32 and int4 (Q4_1 blocks) layers. Both runs are greedy; whether their
tokens match is printed (random weights have near ties, so a mismatch there is not a bug by itself).

    .venv/bin/python bench/tensor_parallel.py --cores 2 --batches 1,8 --steps 32
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from inferplug.benchmark.tp_wire import wire_costs


# A decode step's rows for 8 sequences at ~300 tokens, as rank 0 sends them (engine/parallel/runner.py)
def step_rows():
    from inferplug.ops.step import SeqView, StepLayout

    return ("step", StepLayout([(SeqView(300 + i, list(range(20))), 1) for i in range(8)], [], 16, 0, list(range(8)),
                               [300] * 8, list(range(8)), list(range(8))))


def make_model(out: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=512, intermediate_size=1536, num_hidden_layers=30,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                                      tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


def smollm2_tokenizer():
    """SmolLM2's tokenizer (the model has its vocabulary size), from the default profile's pulled GGUF."""
    from inferplug.benchmark.machine import default_model
    from inferplug.models.loader import load_tokenizer

    return load_tokenizer(default_model())


class Timer:
    """Wraps a callable; the seconds spent in it since the last reset."""

    def __init__(self, fn):
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args):
        start = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


class SendTimer(Timer):
    """Also the pickled bytes of what it sends (what the pipe carries)."""

    bytes = 0

    def __call__(self, kind, arg):
        import pickle

        self.bytes += len(pickle.dumps((kind, arg)))
        return super().__call__(kind, arg)


def measure(model_dir: Path, tp: int, weights: str | None, batch: int, steps: int, threads: int) -> dict:
    """Decode steps of `batch` requests at `tp` ranks, `threads` torch threads each."""
    from inferplug.engine.config import EngineConfig
    from inferplug.engine.llm_engine import LLMEngine
    from inferplug.models.loader import load_weights, read_config
    from inferplug.types import Request, SamplingParams

    config = EngineConfig(num_kv_blocks=256, max_num_batched_tokens=512, tensor_parallel_size=tp,
                          threads_per_rank=threads, weight_format=weights)
    engine = LLMEngine(read_config(model_dir), load_weights(model_dir, config.torch_dtype), smollm2_tokenizer(), config)
    try:
        timers = {}
        if tp > 1:
            group = engine.runner.model.parallel
            for name in ("all_reduce", "gather_logits"):
                timers[name] = Timer(getattr(group, name))
                setattr(group, name, timers[name])
            timers["send"] = SendTimer(engine.runner._send)
            engine.runner._send = timers["send"]
        params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
        for i in range(batch):
            engine.add_request(Request(prompt=[1 + i, 2, 3, 4, 5, 6, 7, 8], params=params, request_id=str(i)))
        engine.step()  # the prefill
        times, collective, send, tokens = [], [], [], {}
        while engine.has_unfinished():
            for t in timers.values():
                t.seconds = 0.0
            start = time.perf_counter()
            for event in engine.step():
                tokens.setdefault(event.request_id, []).extend(event.token_ids)
            times.append(time.perf_counter() - start)
            collective.append(sum(timers[n].seconds for n in ("all_reduce", "gather_logits") if n in timers))
            send.append(timers["send"].seconds if "send" in timers else 0.0)
        row = {"tp": tp, "weights": weights or "fp32", "batch": batch, "step_ms": 1e3 * statistics.median(times),
               "collectives_ms": 1e3 * statistics.median(collective), "send_ms": 1e3 * statistics.median(send),
               "collectives_per_step": (timers["all_reduce"].calls + timers["gather_logits"].calls) // (len(times) + 1)
               if tp > 1 else 0, "tokens": [tokens[str(i)] for i in range(batch)]}
        row["send_bytes"] = timers["send"].bytes // max(timers["send"].calls, 1) if tp > 1 else 0
        return row
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=int, default=2, help="cores to share: TP=1 gets them all, TP=2 half each")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--weights", default="fp32,int4")
    parser.add_argument("--out", default="bench/results/tensor_parallel.json")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model(Path(tmp))
        for weights in args.weights.split(","):
            for batch in map(int, args.batches.split(",")):
                one, two = (measure(model_dir, tp, None if weights == "fp32" else weights, batch, args.steps,
                                    max(args.cores // tp, 1)) for tp in (1, 2))
                two["tokens_match"] = one.pop("tokens") == two.pop("tokens")
                two["ratio"] = two["step_ms"] / one["step_ms"]
                rows += [one, two]
    print(f"{'weights':>7} {'batch':>5} {'tp':>2} {'step ms':>8} {'vs tp1':>6} {'in collectives':>14} {'send rows':>9}"
          f" {'bytes':>6} {'coll/step':>9} {'match':>5}")
    for r in rows:
        print(f"{r['weights']:>7} {r['batch']:>5} {r['tp']:>2} {r['step_ms']:8.2f} {r.get('ratio', 1.0):6.2f}x "
              f"{r['collectives_ms']:11.2f} ms {r['send_ms']:6.3f} ms {r['send_bytes']:>6} {r['collectives_per_step']:>9} "
              f"{str(r.get('tokens_match', '')):>5}")
    wire = wire_costs(step_rows(), [(b, 512) for b in map(int, args.batches.split(","))])
    print("\nwire costs between two idle ranks (median):")
    for what, seconds in wire.items():
        print(f"  {what:<48} {1e6 * seconds:8.1f} us")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"steps": rows, "wire_seconds": wire}, indent=2))


if __name__ == "__main__":
    main()
