"""A hybrid model's second kind of sequence memory (Qwen3.5's Gated DeltaNet layers: models/delta_net.py): a
fixed-size state per running sequence beside the attention layers' paged KV. The tiny random Qwen3.5 of
tests/conftest.py, fp32; its outputs against HF are in tests/models/test_families.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferplug.hardware import probe
from inferplug.models.config import STATE_SNAPSHOTS
from inferplug.models.loader import read_config
from inferplug.profile import load_profile
from inferplug.resolver import resolve
from inferplug.types import Request
from tests.conftest import _save_tiny
from tests.engine.engine_helpers import greedy, hf_greedy, make_engine, prompts_of, run_all, tokens_and_logprobs, tokens_of


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory) -> Path:
    return _save_tiny("qwen35", tmp_path_factory.mktemp("tiny-qwen35"))


def delta_states(engine, slot: int) -> list[torch.Tensor]:
    """Every DeltaNet layer's conv window and recurrent state in `slot`."""
    return [pool[slot].clone() for layer, pools in zip(engine.runner.model.layers, engine.runner.kv_caches)
            if layer.delta is not None for pool in pools]


def test_a_prompt_in_1_3_or_7_chunks_leaves_the_same_state_bits(qwen35_dir):
    """The prompt's chunks end on the delta rule's 64-token grid (engine/scheduler.py), so its chunked form cuts
    the prompt alike however the steps split it: the same state bits, and the same next-token logprobs."""
    prompt = prompts_of([448], vocab=256, seed=2)[0]
    runs = []
    for budget in (448, 192, 64):  # 1, 3 and 7 chunks
        engine = make_engine(qwen35_dir, max_num_batched_tokens=budget)
        events = run_all(engine, [Request(prompt=prompt, params=greedy(1, logprobs=3), request_id="a")])
        runs.append((tokens_and_logprobs(events), delta_states(engine, 0)))
    for outputs, states in runs[1:]:
        assert outputs == runs[0][0]
        assert all(torch.equal(a, b) for a, b in zip(states, runs[0][1]))


def test_a_preempted_sequence_recomputes_its_state_and_gives_the_same_tokens(qwen35_dir):
    """A pool too small for every sequence at once: the newest is preempted, its state slot freed, and it starts
    over when readmitted (from its prompt's snapshot where the prefix cache still holds it); every reply equals HF's
    greedy one."""
    prompts = prompts_of([40, 33, 47, 29], vocab=256, seed=6)
    engine = make_engine(qwen35_dir, num_kv_blocks=12, max_num_batched_tokens=64)
    events = run_all(engine, [Request(prompt=p, params=greedy(24), request_id=str(i)) for i, p in enumerate(prompts)])
    assert engine.scheduler.num_preemptions > 0
    for i, prompt in enumerate(prompts):
        assert tokens_of(events[str(i)]) == hf_greedy(qwen35_dir, prompt, 24), f"request {i}"
    assert sorted(engine.scheduler.free_state_slots) == list(range(engine.config.max_num_seqs))


def test_a_sequence_runs_only_with_a_state_slot(qwen35_dir):
    """max_num_seqs slots: the third request waits for one, and every slot comes back."""
    engine = make_engine(qwen35_dir, max_num_seqs=2)
    for i, prompt in enumerate(prompts_of([9, 12, 15], vocab=256, seed=7)):
        engine.add_request(Request(prompt=prompt, params=greedy(4), request_id=str(i)))
    held = []
    while engine.has_unfinished():
        engine.step()
        held.append(sorted(s.state_slot for s in engine.scheduler.running))
    assert max(map(len, held)) == 2 and all(-1 not in slots for slots in held)
    assert sorted(engine.scheduler.free_state_slots) == [0, 1]


def test_a_prefix_hit_resumes_from_a_snapshot_with_a_cold_prefills_bits(qwen35_dir):
    """A second prompt sharing the first's 150 tokens: its hit is cut to the snapshot at 128 (the first prompt's
    last 64-token point), its state restored there, and its logprobs equal a cold engine's bit for bit."""
    shared, tails = prompts_of([150], vocab=256, seed=8)[0], prompts_of([20, 9], vocab=256, seed=9)
    first, second = shared + tails[0], shared + tails[1]
    engine = make_engine(qwen35_dir)
    run_all(engine, [Request(prompt=first, params=greedy(4), request_id="a")])
    warm = run_all(engine, [Request(prompt=second, params=greedy(6, logprobs=3), request_id="b")])
    assert warm["b"][-1].usage.cached_tokens == 128
    cold = run_all(make_engine(qwen35_dir), [Request(prompt=second, params=greedy(6, logprobs=3), request_id="b")])
    assert tokens_and_logprobs(warm) == tokens_and_logprobs(cold)


def test_a_chats_next_turn_resumes_from_its_replys_snapshot(qwen35_dir):
    """Turn 2 is turn 1's prompt, its reply and a new message: it resumes at the last 64-token point of turn 1's
    reply (the snapshot kept while it generated), and answers as HF does."""
    engine = make_engine(qwen35_dir)
    prompt = prompts_of([50], vocab=256, seed=10)[0]
    reply = tokens_of(run_all(engine, [Request(prompt=prompt, params=greedy(100), request_id="1")])["1"])
    turn2 = prompt + reply + prompts_of([12], vocab=256, seed=11)[0]
    events = run_all(engine, [Request(prompt=turn2, params=greedy(8), request_id="2")])
    assert events["2"][-1].usage.cached_tokens == (len(prompt) + len(reply) - 1) // 64 * 64 == 128
    assert tokens_of(events["2"]) == hf_greedy(qwen35_dir, turn2, 8)


def test_snapshots_are_bounded(qwen35_dir):
    engine = make_engine(qwen35_dir, state_snapshots=2)
    for i, prompt in enumerate(prompts_of([70, 80, 90, 100], vocab=256, seed=12)):
        run_all(engine, [Request(prompt=prompt, params=greedy(2), request_id=str(i))])
    assert len(engine.snapshots.snapshots) == 2


def test_resolve_counts_the_states_and_says_what_runs(qwen35_dir, tmp_path):
    path = tmp_path / "qwen35.toml"
    path.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{qwen35_dir}"\n[limits]\n'
                    'max_num_seqs = 6\n')
    plan = resolve(load_profile(str(path)), probe())
    assert plan.prefix_caching
    assert "no speculative decoding or beam search: its Gated DeltaNet layers keep one state per sequence" in \
        "\n".join(plan.reasons)
    assert any(r.startswith("prefix caching: a hit resumes from a snapshot of the DeltaNet state") for r in plan.reasons)
    per_state = read_config(qwen35_dir).state_bytes_per_sequence(4)
    assert plan.memory.state_bytes == (6 + STATE_SNAPSHOTS) * per_state > 0
    assert "DeltaNet states" in plan.memory.summary()
