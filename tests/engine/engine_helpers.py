"""Helpers for engine tests: engines over local checkpoints, HF references, run-to-completion."""

from __future__ import annotations

from pathlib import Path

import torch

from inferplug.engine.config import EngineConfig
from inferplug.engine.llm_engine import LLMEngine
from inferplug.models.loader import load_tokenizer, load_weights, read_config
from inferplug.types import Event, Request, SamplingParams


def make_engine(model_dir: Path, draft=None, **overrides) -> LLMEngine:
    """An fp32 engine on a local model dir or GGUF file (the pool is checked after the test). weight_format="gguf":
    a GGUF's quantized matrices run in the file's own blocks, as NativeBackend loads them."""
    config = EngineConfig(**{"num_kv_blocks": 128, "max_num_batched_tokens": 256, **overrides})
    tokenizer = load_tokenizer(model_dir)
    layers = "gguf" if config.weight_format == "gguf" else None
    if layers:  # the block layers bind their kernels as they are made
        from inferplug.kernels import cpu as cpu_kernels

        cpu_kernels.ops()
    engine = LLMEngine(read_config(model_dir), load_weights(model_dir, config.torch_dtype, gguf_layers=layers), tokenizer, config,
                       render_chat=lambda messages, tools: tokenizer.apply_chat_template(
                           messages, tools=tools, tokenize=False, add_generation_prompt=True), draft=draft)
    return engine


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def run_all(engine: LLMEngine, requests: list[Request], arrivals: dict[int, list[Request]] | None = None):
    """Step until done; `arrivals` adds more requests at given step numbers. Returns {request_id: [events]}."""
    for request in requests:
        engine.add_request(request)
    events: dict[str, list[Event]] = {}
    step = 0
    while engine.has_unfinished() or (arrivals and any(k >= step for k in arrivals)):
        for request in (arrivals or {}).get(step, []):
            engine.add_request(request)
        for event in engine.step():
            events.setdefault(event.request_id, []).append(event)
        step += 1
    return events


def tokens_of(events: list[Event], index: int = 0) -> list[int]:
    return [t for e in events if e.index == index for t in e.token_ids]


def text_of(events: list[Event], index: int = 0) -> str:
    return "".join(e.text for e in events if e.index == index)


def logprob_trace(events: list[Event]) -> list:
    """A request's tokens with their logprobs and top alternatives, exactly as floats, however its events cut them
    (a speculative step gives several tokens an event)."""
    return [(lp.token_id, lp.logprob, lp.top) for e in events for lp in e.logprobs]


def tokens_and_logprobs(events: dict[str, list[Event]]) -> dict:
    """run_all's events as {request_id: [(token ids, [(token, logprob, top)])]}: what bit-for-bit checks compare."""
    return {rid: [(e.token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in e.logprobs]) for e in ev]
            for rid, ev in events.items()}


def spy_fused_steps(monkeypatch) -> list[bool]:
    """Per engine step from now on, whether CpuKernelOps.run_layers took decode_layers' one-call path."""
    from inferplug.ops.cpu_ops import CpuKernelOps

    fused_steps, run_layers = [], CpuKernelOps.run_layers

    def spy(self, *args, **kwargs):
        fused_steps.append(run_layers(self, *args, **kwargs))
        return fused_steps[-1]

    monkeypatch.setattr(CpuKernelOps, "run_layers", spy)
    return fused_steps


def unfuse_steps(monkeypatch) -> None:
    """Every step from now on takes DecoderModel.forward's layer-by-layer path."""
    from inferplug.ops.cpu_ops import CpuKernelOps

    monkeypatch.setattr(CpuKernelOps, "block_layers", lambda self, model, ctx, tokens: None)


_hf_cache: dict[Path, object] = {}


def hf_model(model_dir: Path):
    if model_dir not in _hf_cache:
        import transformers

        _hf_cache[model_dir] = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return _hf_cache[model_dir]


def hf_greedy(model_dir: Path, prompt: list[int], max_tokens: int) -> list[int]:
    return hf_generate(hf_model(model_dir), prompt, max_tokens)


def hf_generate(model, prompt: list[int], max_tokens: int) -> list[int]:
    """HF's greedy tokens, exactly max_tokens of them, as the engine's ignore_eos gives. Not min_new_tokens:
    it suppresses generation_config's EOS (token 2 in the tiny models), which ignore_eos does not."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, eos_token_id=None, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prompts_of(lengths: list[int], vocab: int = 300, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
