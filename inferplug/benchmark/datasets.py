"""Benchmark workloads: synthetic random prompts, a ShareGPT-format file, or the RAG workload.

Each yields BenchRequests with the prompt both as text (for HTTP targets) and, where exact,
as token ids (in-process targets then skip re-tokenization, so lengths are exactly as asked).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplug.errors import InferPlugError
from inferplug.types import DocumentSpan

# Without a tokenizer (an HTTP target and no --tokenizer) prompts are built from common words,
# about one token each in BPE vocabularies; the server's usage then gives the real lengths.
_WORDS = (
    "time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company system program question work government number night point "
    "home water room mother area money story fact month lot right study book eye job word business issue "
    "side kind head house service friend father power hour game line end member law car city community name"
).split()


@dataclass
class BenchRequest:
    prompt: str
    prompt_len: int  # tokens; an estimate when prompt_ids is None and no tokenizer was given
    output_len: int
    prompt_ids: list[int] | None = None
    documents: list[DocumentSpan] | None = None  # RAG cache hints for in-process targets


def _length_range(mean: int, range_ratio: float) -> tuple[int, int]:
    return max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))


def sample_random(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    tokenizer: Any = None,
    seed: int = 0,
    num_prefixes: int = 1,
) -> list[BenchRequest]:
    """Random-token prompts: lengths uniform in mean*(1 -/+ range_ratio), behind a shared prefix (request i
    behind prefix i mod num_prefixes: several system prompts, each shared by its share of the requests)."""
    if not 0.0 <= range_ratio < 1.0:
        raise InferPlugError(f"--random-range-ratio {range_ratio} is invalid: use a value in [0, 1)")
    if input_len < 1 or output_len < 1 or prefix_len < 0 or num_prefixes < 1:
        raise InferPlugError("--random-input-len, --random-output-len and --random-num-prefixes must be >= 1, "
                             "--random-prefix-len >= 0")
    rng = random.Random(seed)
    vocab = _plain_token_ids(tokenizer) if tokenizer is not None else None
    pick = (lambda: rng.choice(vocab)) if vocab else (lambda: rng.choice(_WORDS))
    prefixes = [[pick() for _ in range(prefix_len)] for _ in range(num_prefixes)]
    requests = []
    for i in range(num_prompts):
        prefix = prefixes[i % num_prefixes]
        body = [pick() for _ in range(rng.randint(*_length_range(input_len, range_ratio)))]
        out = rng.randint(*_length_range(output_len, range_ratio))
        tokens = prefix + body
        if vocab:
            requests.append(BenchRequest(tokenizer.decode(tokens), len(tokens), out, prompt_ids=tokens))
        else:
            requests.append(BenchRequest(" ".join(tokens), len(tokens), out))
    return requests


def _plain_token_ids(tokenizer: Any) -> list[int]:
    """Every id that is not a special token, so random prompts never contain an EOS or a chat marker."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    return [i for i in range(len(tokenizer)) if i not in special]


def sharegpt_requests(
    pairs: list[tuple[str, str]],
    num_prompts: int,
    tokenizer: Any = None,
    output_len: int | None = None,
    seed: int = 0,
) -> list[BenchRequest]:
    """BenchRequests from (prompt, reply) pairs of a ShareGPT file (see read_sharegpt_pairs).

    The first turn is the prompt; the reply's length is the output length unless `output_len` fixes it.
    Pairs too short (< 4 tokens) or too long (prompt > 1024, total > 2048) are skipped, as in vLLM.
    """
    pairs = list(pairs)
    random.Random(seed).shuffle(pairs)
    count = _token_counter(tokenizer)
    requests = []
    for prompt, reply in pairs:
        prompt_len, reply_len = count(prompt), output_len or count(reply)
        if prompt_len < 4 or reply_len < 4 or prompt_len > 1024 or prompt_len + reply_len > 2048:
            continue
        requests.append(BenchRequest(prompt, prompt_len, reply_len))
        if len(requests) == num_prompts:
            return requests
    if not requests:
        raise InferPlugError("the ShareGPT file has no conversation with a usable prompt and reply (4 to 1024 tokens)")
    return requests


def read_sharegpt_pairs(path: str | Path) -> list[tuple[str, str]]:
    """ShareGPT JSON: a list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}."""
    path = Path(path)
    fix = 'expected a JSON list of {"conversations": [{"from": ..., "value": ...}, ...]} (ShareGPT format)'
    if not path.is_file():
        raise InferPlugError(f"--dataset-path {path}: no such file; give the path of a ShareGPT-format JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InferPlugError(f"{path} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(data, list):
        raise InferPlugError(f"{path}: {fix}, got a {type(data).__name__}")
    pairs = []
    for entry in data:
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        values = [t.get("value") if isinstance(t, dict) else None for t in turns[:2]]
        if all(isinstance(v, str) and v for v in values):
            pairs.append((values[0], values[1]))
    if not pairs:
        raise InferPlugError(f"{path}: no entry has two text turns; {fix}")
    return pairs


def _token_counter(tokenizer: Any):
    if tokenizer is None:
        return lambda text: max(1, len(text) // 4)  # ~4 characters per token; the server's usage corrects it
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def load_tokenizer(path: str | Path) -> Any:
    """An HF tokenizer from a local model directory or GGUF file (for HTTP targets' prompt lengths)."""
    from transformers import AutoTokenizer

    path = Path(path)
    if not path.exists():
        raise InferPlugError(f"--tokenizer {path}: no such file or directory; give a local HF model dir or GGUF file")
    if path.is_file():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
