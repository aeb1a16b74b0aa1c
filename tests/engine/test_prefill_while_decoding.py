"""A long prompt arriving among decoding streams: while they decode, each step carries at most
max_prefill_tokens_while_decoding prefill tokens beside their rows (their TPOT bound, bench/prefill.py --streams),
and the prompt still gets the whole budget once it prefills alone. Answers match HF whatever the chunking."""

from __future__ import annotations

from inferplug.engine.model_runner import is_decode_row
from inferplug.types import Request
from tests.engine.engine_helpers import greedy, hf_greedy, make_engine, prompts_of, run_all, tokens_of


def test_prefill_beside_decode_rows_is_capped_and_answers_match_hf(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_batched_tokens=64, max_prefill_tokens_while_decoding=8)
    steps = []
    schedule = engine.scheduler.schedule

    def recorded():
        scheduled = schedule()
        steps.append([(is_decode_row(seq, n), n) for seq, n in scheduled])
        return scheduled

    engine.scheduler.schedule = recorded
    short, long = prompts_of([6, 7, 300], seed=31), prompts_of([300], seed=32)[0]
    streams = [Request(prompt=p, params=greedy(24), request_id=f"s{i}") for i, p in enumerate(short[:2])]
    events = run_all(engine, streams, {2: [Request(prompt=long, params=greedy(4), request_id="long")]})

    with_decodes = [sum(n for decode, n in step if not decode) for step in steps if any(d for d, _ in step)]
    alone = [sum(n for _, n in step) for step in steps if not any(d for d, _ in step)]
    assert max(with_decodes) == 8, "prefill rows beside decode rows: capped"
    assert 64 in alone, "the prompt prefilling alone: the whole budget"
    assert tokens_of(events["long"]) == hf_greedy(tiny_model_dir, long, 4)
    for i, prompt in enumerate(short[:2]):
        assert tokens_of(events[f"s{i}"]) == hf_greedy(tiny_model_dir, prompt, 24)
