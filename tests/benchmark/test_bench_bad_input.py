"""Bad input to `inferplug bench` fails with a clear message before any load is sent."""

import json

import pytest

from inferplug.commands import bench
from inferplug.errors import InferPlugError
from tests.benchmark.bench_helpers import free_port, parse


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--request-rate", "0"], "--request-rate 0.0 is invalid"),
        (["--request-rate", "-2"], "--request-rate -2.0 is invalid"),
        (["--sweep-rates", "1,0"], "--request-rate 0.0 is invalid"),
        (["--sweep-rates", "1,fast"], "--sweep-rates '1,fast' is invalid"),
        (["--burstiness", "0"], "--burstiness"),
        (["--num-prompts", "0"], "--num-prompts 0 is invalid"),
        (["--max-concurrency", "0"], "--max-concurrency 0 is invalid"),
        (["--goodput", "ttft=5"], "--goodput 'ttft=5' is invalid"),
        (["--dataset-name", "sharegpt"], "needs --dataset-path"),
        (["--dataset-name", "sharegpt", "--dataset-path", "/nonexistent/sg.json"], "no such file"),
        (["--random-range-ratio", "1.5", "--url", "http://127.0.0.1:1"], "--random-range-ratio"),
        (["--url", "ftp://x"], "--url 'ftp://x' is invalid"),
    ],
)
def test_bad_flags(argv, message):
    args = parse(*argv)
    with pytest.raises(InferPlugError, match=message.replace("(", r"\(")):
        bench.run(args)


def test_malformed_dataset_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(InferPlugError, match="ShareGPT format"):
        bench.run(parse("--dataset-name", "sharegpt", "--dataset-path", str(path)))


def test_unreachable_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(InferPlugError, match="cannot reach an OpenAI-compatible server"):
        bench.run(parse("--url", url, "--num-prompts", "2", "--no-progress"))


def test_profile_that_cannot_load(tmp_path):
    profile = tmp_path / "broken.toml"
    profile.write_text('name = "broken"\n[model]\npath = "/nonexistent/model.gguf"\n')
    with pytest.raises(InferPlugError, match="nonexistent"):
        bench.run(parse(str(profile), "--num-prompts", "2", "--no-progress"))
