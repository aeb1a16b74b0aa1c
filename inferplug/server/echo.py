"""OpenAI completions' `echo`: the prompt before each choice's completion, and with `logprobs` its tokens' logprobs
before the completion's (the first prompt token has none: null), as lm-evaluation-harness reads them to score a
continuation (echo, logprobs, max_tokens 0 or 1). The prompt logprobs come from the engine (SamplingParams.
prompt_logprobs) on choice 0's first event; max_tokens 0 runs one token and drops it here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from inferplug.errors import RequestError
from inferplug.types import Event, TokenLogprob


@dataclass
class Echo:
    texts: list[str]  # per prompt: the text echoed (a token-id prompt decoded)
    first_tokens: list[tuple[int, str]]  # per prompt: its first token (id, text), which has no logprob
    per_prompt: int  # choices per prompt (n)
    prompt_only: bool  # max_tokens 0: the generated token is dropped
    prompt_entries: dict[int, list[TokenLogprob | None]] = field(default_factory=dict)  # prompt -> its logprobs
    started: set[int] = field(default_factory=set)  # choices whose first event passed

    def apply(self, event: Event) -> Event:
        """The event as the client sees it: the prompt (and its logprobs) first on a choice's first event."""
        prompt = event.index // self.per_prompt
        if event.prompt_logprobs is not None:
            self.prompt_entries[prompt] = event.prompt_logprobs
        if self.prompt_only:
            event = dataclasses.replace(event, text="", token_ids=[], logprobs=None if event.logprobs is None else [])
        if event.index in self.started:
            return event
        self.started.add(event.index)
        logprobs = event.logprobs
        if logprobs is not None and prompt in self.prompt_entries:
            token_id, text = self.first_tokens[prompt]
            first = TokenLogprob(token_id, text, None)  # OpenAI's null for the first
            logprobs = [first, *self.prompt_entries[prompt][1:], *logprobs]
        return dataclasses.replace(event, text=self.texts[prompt] + event.text, logprobs=logprobs)


def make_echo(tokenizer, prompts: list[str | list[int]], per_prompt: int, prompt_only: bool) -> Echo:
    """The echo of a completions call's prompts, tokenized as the engine tokenizes them (engine.encode)."""
    if tokenizer is None:
        raise RequestError("echo needs the model's tokenizer, which a remote backend does not have here; drop echo",
                           param="echo")
    vocab = len(tokenizer)
    for p in prompts:  # checked before decoding: a tokenizer overflows on ids out of its range
        if isinstance(p, list) and (bad := [t for t in p if not 0 <= t < vocab]):
            raise RequestError(f"the prompt holds token ids outside the vocabulary [0, {vocab}): {bad[:5]}",
                               param="prompt")
    ids = [p if isinstance(p, list) else tokenizer.encode(p) for p in prompts]
    return Echo(texts=[p if isinstance(p, str) else tokenizer.decode(p) for p in prompts],
                first_tokens=[(i[0], tokenizer.decode(i[:1])) for i in ids], per_prompt=per_prompt,
                prompt_only=prompt_only)
