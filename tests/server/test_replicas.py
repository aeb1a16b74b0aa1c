"""`inferplug serve --replicas 2` on a local Ray, as a user runs it: one subprocess (one Ray start) for the module,
the official openai client on loopback. Every Ray process it starts carries a marker in its environment, so
the tests find (and kill) only those, and check that none is left after shutdown."""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import json
import shutil

import httpx
import openai
import pytest

from inferplug.server.launch import start_serve
from tests.server.test_guard import raw_exchange
from tests.server.test_serve_command import stop

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

KEY = "replica-key"
MARK = "INFERPLUG_TEST_RAY_MARK"
# Streams that must still run when the test acts on them (a client leaving, a replica killed): the tiny model
# streams 400 tokens in about 0.15 s, less than a cancel takes to cross Ray, so it gets a long context.
LONG_TOKENS = 12000


def write_profile(directory: Path, model_dir: Path) -> Path:
    path = directory / "tiny-replicas.toml"
    path.write_text('backend = "ctranslate2"\n'
                    f'[model]\npath = "{model_dir}"\nserved_name = "tiny"\n'
                    '[ctranslate2]\ncompute_type = "float32"\ndevice = "cpu"\n'
                    '[parallel]\nreplicas = 2\n')
    return path


def marked_pids(mark: str) -> set[int]:
    """Processes whose environment holds MARK=mark: this module's server and every Ray process it started."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class Replicated:
    def __init__(self, tmp: Path, model_dir: Path):
        self.mark = uuid.uuid4().hex
        env = {**os.environ, MARK: self.mark, "TMPDIR": str(tmp), "RAY_TMPDIR": str(tmp)}
        env.pop("RAY_ADDRESS", None)
        self.proc, self.base = start_serve(str(write_profile(tmp, model_dir)), "--api-key", KEY, "--log-level",
                                           "warning", env=env, timeout=300)

    auth = {"Authorization": f"Bearer {KEY}"}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=KEY, max_retries=0, timeout=120)

    def replicas(self) -> dict[str, int]:
        """replica id -> pid, from /metrics."""
        text = httpx.get(self.base + "/metrics", headers=self.auth, timeout=30).text
        rows = [line for line in text.splitlines() if line.startswith("inferplug_replica_info{")]
        return {row.split('replica="')[1].split('"')[0]: int(row.split('pid="')[1].split('"')[0]) for row in rows}

    def metric(self, sample: str, replica: str) -> float:
        text = httpx.get(self.base + "/metrics", headers=self.auth, timeout=30).text
        for line in text.splitlines():
            if line.startswith(sample + "{") and f'replica="{replica}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def chat(self, content: str, **kw) -> tuple[str, str]:
        raw = self.client().chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0, **kw)
        return raw.headers["x-inferplug-replica"], raw.parse().choices[0].message.content


def until(check, seconds: float = 120.0, what: str = "the condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen in {seconds:.0f} s")


def long_context_copy(model_dir: Path, out: Path) -> Path:
    """The tiny model with room for LONG_TOKENS: RoPE weights do not depend on the maximum position."""
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "max_position_embeddings": LONG_TOKENS + 512}))
    return out


@pytest.fixture(scope="module")
def replicated(tiny_llama_dir):
    with tempfile.TemporaryDirectory(prefix="ipr", dir="/tmp") as tmp:  # short: Ray's socket paths live here
        server = Replicated(Path(tmp), long_context_copy(tiny_llama_dir, Path(tmp) / "model"))
        yield server
        if server.proc.poll() is None:
            stop(server.proc)


def test_openai_client_is_answered_by_both_replicas(replicated):
    until(lambda: len(replicated.replicas()) == 2, what="both replicas publishing metrics")
    # distinct first letters: no shared prefix, so the router spreads them over the replicas
    served = {replicated.chat(f"{letter} says hello")[0] for letter in "abcdefgh"}
    client = replicated.client()
    for letter in "ijklmnop":
        with client.chat.completions.with_streaming_response.create(
                model="tiny", messages=[{"role": "user", "content": f"{letter} streams"}], max_tokens=4,
                stream=True) as response:
            chunks = list(response.parse())
            served.add(response.headers["x-inferplug-replica"])
        assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert served == set(replicated.replicas())


def test_a_shared_prefix_stays_on_one_replica(replicated):
    system = "q" * 200  # the same long system prompt, different questions
    served = {replicated.chat(system + f" question {i}")[0] for i in range(6)}
    assert len(served) == 1


def test_api_key_and_metrics_per_replica_and_summed(replicated):
    assert httpx.get(replicated.base + "/v1/models", timeout=30).status_code == 401
    assert httpx.get(replicated.base + "/v1/models", headers=replicated.auth, timeout=30).json()["data"][0]["id"] \
        == "tiny"
    ids = list(replicated.replicas())
    sample = "inferplug_generation_tokens_total"

    def settled():  # replicas publish their metrics every second
        per = [replicated.metric(sample, r) for r in ids]
        return all(per) and replicated.metric(sample, "all") == sum(per)

    until(settled, 120, "per-replica and summed generation tokens")


def test_the_front_refuses_a_missing_key_before_the_body_arrives(replicated):
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n")
    started = time.monotonic()
    answer = raw_exchange(replicated.base, head, wait=15)  # no body is ever sent: no replica sees this request
    assert answer.startswith("HTTP/1.1 401") and "invalid_api_key" in answer, answer
    assert time.monotonic() - started < 15  # a bound for a hang: the front did not wait for the body


def test_client_leaving_a_stream_aborts_it_on_its_replica(replicated):
    stream = replicated.client().chat.completions.with_streaming_response.create(
        model="tiny", messages=[{"role": "user", "content": "r leaves early"}], max_tokens=LONG_TOKENS, stream=True,
        extra_body={"ignore_eos": True})
    with stream as response:
        replica = response.headers["x-inferplug-replica"]
        next(iter(response.parse()))
    sample = "inferplug_requests_total"
    metrics = replicated.base + "/metrics"
    until(lambda: any('status="499"' in line and f'replica="{replica}"' in line and line.startswith(sample)
                      for line in httpx.get(metrics, headers=replicated.auth, timeout=30).text.splitlines()),
          120, "the replica counting the abandoned stream as 499")


def test_killed_replica_fails_only_its_requests_and_is_replaced(replicated):
    before = replicated.replicas()
    client = replicated.client()
    streams = []
    for letter in "stuvwxyz":  # streams spread over both replicas; the last (the victim's) long enough to be cut
        response = client.chat.completions.with_streaming_response.create(
            model="tiny", messages=[{"role": "user", "content": f"{letter} runs long"}],
            max_tokens=LONG_TOKENS if letter == "z" else 480,
            stream=True, temperature=0, extra_body={"ignore_eos": True}).__enter__()
        chunks = iter(response.parse())
        next(chunks)  # in flight
        streams.append((response, response.headers["x-inferplug-replica"], chunks))
    victim = streams[-1][1]  # the replica of the stream that just began: it has most of its tokens to go
    assert before[victim] in marked_pids(replicated.mark)  # a process this module started
    os.kill(before[victim], signal.SIGKILL)

    def finish(item):
        response, replica, chunks = item
        try:
            for _ in chunks:
                pass
            return replica, "done"
        except openai.APIError as exc:
            return replica, str(exc)
        finally:
            response.close()

    with ThreadPoolExecutor(len(streams)) as pool:
        outcomes = list(pool.map(finish, streams))
    assert all(outcome == "done" for replica, outcome in outcomes if replica != victim)
    failed = [outcome for replica, outcome in outcomes if replica == victim and outcome != "done"]
    assert failed and all("the replica serving this request died" in f for f in failed)
    survivor = next(r for r in before if r != victim)
    assert replicated.chat("a survivor answers")[0] in (survivor, *replicated.replicas())
    replaced = until(lambda: (now := replicated.replicas()) and len(now) == 2 and victim not in now and now,
                     180, "Ray replacing the killed replica")
    newcomer = next(r for r in replaced if r not in before)
    served = {replicated.chat(f"{c} after the replacement")[0] for c in "ABCDEFGH"}
    assert newcomer in served


def test_shutdown_leaves_no_ray_process(replicated):
    assert len(marked_pids(replicated.mark)) > 3  # the server, gcs, raylet, replicas...
    output = stop(replicated.proc)  # SIGTERM, as a service manager stops it
    assert "Traceback" not in output, output
    until(lambda: not marked_pids(replicated.mark), 120, "every Ray process exiting")
