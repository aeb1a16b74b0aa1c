"""Speculative decoding (prompt lookup, a draft model) vs plain greedy on SmolLM2-135M (the default profile's
path), same run.

Workload: an input-grounded task, rewriting a given ~350-token text with a small edit, so the answer repeats
long runs of the prompt: prompt lookup's best case, and the common shape of RAG extraction and editing.
Each engine runs one stream (the 8 texts one after another, each alone: SmolLM2-135M copies 6 of them and
paraphrases 2, so one text alone says little), then a batch of 8 (the 8 texts at once). Both engines are greedy,
so their answers must match token for token (checked). Prints a table and writes JSON.
No smaller model shares SmolLM2's tokenizer here, so the draft is SmolLM2's own first L layers
(models/layer_skip.py; "draft L=30" is the whole model drafting for itself: every proposal accepted, at the
cost of a second full model).

    .venv/bin/python bench/speculative.py --threads 2
    .venv/bin/python bench/speculative.py --num-tokens 3,5,8  # proposal lengths to compare
    .venv/bin/python bench/speculative.py --draft-layers 4,30  # draft models to compare ("" for none)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

CITIES = ("Lyon", "Porto", "Graz", "Turku", "Ghent", "Bergen", "Cork", "Brno")
TEXT = (
    "{city} grew up around a bridge over a wide river. Merchants crossed the bridge every morning with carts of "
    "grain, wool and salt, and by noon the market square was full of voices. The town council met in a stone "
    "hall beside the square, and its records, kept since the thirteenth century, tell of floods, fires and long "
    "winters. In one of those winters the river froze so hard that the merchants drove their carts across the "
    "ice instead of the bridge, and the toll keeper, who lived from the bridge tolls, walked out onto the ice "
    "to collect his money anyway. The council laughed at him, but it paid him that year from the town's own "
    "purse. Later centuries brought a railway station, a university and three new bridges, yet the old bridge "
    "still stands. Every spring the people of {city} hold a fair on it, with music, bread and cheese from the "
    "valley farms, and a race of small wooden boats under its arches. Children paint the boats in the colours "
    "of their streets, and the winner carries a brass bell through the market square while the whole town "
    "rings along. Visitors often ask why a town so proud of its new buildings keeps such an old bridge. The "
    "answer people give is always the same: the bridge was here before the town, and the town would not be "
    "here without it. The council still meets in the stone hall, and it still keeps its records by hand."
)
ASK = "Rewrite the following text exactly as it is, but replace the word \"bridge\" with \"crossing\":\n\n{text}"


def prompts(tokenizer, count: int) -> list[list[int]]:
    out = []
    for city in CITIES[:count]:
        chat = [{"role": "user", "content": ASK.format(text=TEXT.format(city=city))}]
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def run(engine, batch: list[list[int]], max_tokens: int) -> dict:
    from inferplug.types import Request, SamplingParams

    before = engine.stats()
    start = time.perf_counter()
    for i, prompt in enumerate(batch):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        engine.add_request(Request(prompt=prompt, params=params, request_id=f"r{i}"))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for event in engine.step():
            tokens.setdefault(event.request_id, []).extend(event.token_ids)
    wall = time.perf_counter() - start
    after = engine.stats()
    drafts = after.get("spec_draft_tokens", 0) - before.get("spec_draft_tokens", 0)
    accepted = after.get("spec_accepted_tokens", 0) - before.get("spec_accepted_tokens", 0)
    total = sum(len(t) for t in tokens.values())
    return {"output_tokens": total, "seconds": wall, "tok_per_s": total / wall, "draft_tokens": drafts,
            "accepted_tokens": accepted, "acceptance_rate": accepted / drafts if drafts else None,
            # tokens per forward a request took: 1 without speculation, 1 + accepted per step with it
            "tokens_per_step": total / (total - accepted), "tokens": [tokens[k] for k in sorted(tokens)]}


def run_each(engine, batch: list[list[int]], max_tokens: int) -> dict:
    """run() on each prompt alone, one after another, summed; with each text's acceptance."""
    runs = [run(engine, [prompt], max_tokens) for prompt in batch]
    total = {key: sum(r[key] for r in runs) for key in ("output_tokens", "seconds", "draft_tokens", "accepted_tokens")}
    drafts, accepted = total["draft_tokens"], total["accepted_tokens"]
    return total | {"tok_per_s": total["output_tokens"] / total["seconds"],
                    "acceptance_rate": accepted / drafts if drafts else None,
                    "tokens_per_step": total["output_tokens"] / (total["output_tokens"] - accepted),
                    "acceptance_per_text": [r["acceptance_rate"] for r in runs],
                    "tokens": [t for r in runs for t in r["tokens"]]}


def build(threads: int, method: str, num_tokens: int = 4, draft: Path | None = None):
    from inferplug.backends.native import build_engine
    from inferplug.hardware import probe
    from inferplug.profile import ModelSource, Speculative, load_profile
    from inferplug.resolver import resolve

    profile = load_profile("smollm2-135m")
    profile.native.num_threads = threads
    profile.speculative = Speculative(method=method, num_tokens=num_tokens,
                                      draft_model=ModelSource(path=draft) if draft else None)
    return build_engine(profile, resolve(profile, probe()))


def layer_skip_draft(layers: int, root: Path) -> Path:
    """SmolLM2's first `layers` layers saved as a draft model under root."""
    from inferplug.benchmark.machine import default_model
    from inferplug.models.layer_skip import save_layer_skip_draft

    return save_layer_skip_draft(default_model(), root / f"draft-{layers}", layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-tokens", default="4", help="proposal lengths to run, comma-separated")
    ap.add_argument("--draft-layers", default="4,30", help="draft models (SmolLM2's first L layers) to run at "
                    "the first proposal length, comma-separated; empty for none")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default="bench/results/speculative.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    engines = {"plain": build(args.threads, "none")}
    engines |= {f"ngram k={k}": build(args.threads, "ngram", int(k)) for k in args.num_tokens.split(",")}
    k = int(args.num_tokens.split(",")[0])
    with tempfile.TemporaryDirectory() as root:  # the engines hold the drafts' weights once built
        engines |= {f"draft L={n} k={k}": build(args.threads, "draft", k, layer_skip_draft(int(n), Path(root)))
                    for n in filter(None, args.draft_layers.split(","))}
    batch = prompts(engines["plain"].tokenizer, 8)
    report = {"workload": {"prompt_tokens": [len(p) for p in batch], "max_tokens": args.max_tokens,
                           "threads": args.threads}, "runs": {}}
    for name, engine in engines.items():
        run(engine, batch[:1], 16)  # warm-up
        report["runs"][name] = {"single": run_each(engine, batch, args.max_tokens),
                                "batch8": run(engine, batch, args.max_tokens)}
    plain = report["runs"]["plain"]
    print(f"{'engine':<18}{'1-stream tok/s':>15}{'speed-up':>10}{'accept':>8}{'tok/step':>9}"
          f"{'batch-8 tok/s':>15}{'speed-up':>10}{'accept':>8}{'tok/step':>9}")
    for name, r in report["runs"].items():
        for shape in ("single", "batch8"):
            r[shape]["speedup"] = r[shape]["tok_per_s"] / plain[shape]["tok_per_s"]
            r[shape]["same_tokens_as_plain"] = r[shape]["tokens"] == plain[shape]["tokens"]
        cells = "".join(f"{r[s]['tok_per_s']:>15.1f}{r[s]['speedup']:>9.2f}x"
                        f"{(r[s]['acceptance_rate'] or 0):>8.2f}{r[s]['tokens_per_step']:>9.2f}"
                        for s in ("single", "batch8"))
        same = "" if r["single"]["same_tokens_as_plain"] and r["batch8"]["same_tokens_as_plain"] else "  DIFFERS"
        print(f"{name:<18}{cells}{same}")
    for r in report["runs"].values():
        for shape in ("single", "batch8"):
            del r[shape]["tokens"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
