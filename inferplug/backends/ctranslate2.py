"""The CTranslate2 backend: an HF dir or GGUF model, converted once, run by CTranslate2.

Requests that arrive together are batched into one `generate_batch` call (ct2_batcher), and
their tokens stream back through its per-token callback, straight into the caller's EventChannel; the
output stage runs on the caller's side as it reads them (backends/local_stream.py). A chat whose first message is a
system prompt passes that prompt as CTranslate2's `static_prompt`, whose model state
CTranslate2 caches and reuses for every later request with the same system prompt.

`seed` is best effort, as in OpenAI's API: CTranslate2 seeds one random generator per worker
thread when that thread first samples (`set_random_seed` reaches only threads started later),
so a per-request seed cannot be honoured on a loaded model.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

from inferplug.backends.bridge import EventChannel
from inferplug.backends.ct2_batcher import Batcher, Job
from inferplug.backends.local_stream import LocalBackend, LocalRequest
from inferplug.errors import BackendUnavailable, RequestError
from inferplug.types import Capabilities, Event, Request

if TYPE_CHECKING:
    from inferplug.profile import Profile
    from inferplug.plan import Plan

COMPUTE_TYPES = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float32", "float16", "bfloat16")


class CTranslate2Backend(LocalBackend):
    name = "ctranslate2"

    def __init__(self, profile: Profile, plan: Plan) -> None:
        super().__init__(profile, plan)
        try:
            import ctranslate2
        except ImportError as exc:
            raise BackendUnavailable(
                f"the ctranslate2 backend needs the ctranslate2 package ({exc}); pip install 'inferplug[ctranslate2]'"
            ) from exc
        from inferplug.backends.ct2_convert import converted_model_dir
        from inferplug.models.loader import load_tokenizer, read_config
        from inferplug.sources import ensure_local

        source = ensure_local(profile.model)
        self.device, self.compute_type = device_and_compute_type(profile, plan)
        quantization = self.compute_type if self.compute_type in COMPUTE_TYPES else "float32"
        model_dir = converted_model_dir(source, quantization)
        self.config = read_config(source)
        self._tokenizer = load_tokenizer(source, profile.model.tokenizer or str(model_dir / "tokenizer"))
        opts = profile.ctranslate2
        self._generator = ctranslate2.Generator(
            str(model_dir), device=self.device, device_index=_device_index(plan.device),
            compute_type=self.compute_type,
            inter_threads=opts.inter_threads, intra_threads=opts.intra_threads,
        )
        self._batcher = Batcher(self._generator, opts.inter_threads, plan.max_num_seqs)
        self._seen_static_prompts: set[tuple[str, ...]] = set()
        self._static_prompt_hits = 0
        self._requests = 0
        self._counts_lock = threading.Lock()  # requests start on their callers' threads

    # --- protocol -------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(n=True)

    @property
    def context_length(self) -> int:
        return self.plan.max_model_len or self.config.max_position_embeddings

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def _start(self, request: Request, channel: EventChannel) -> None:
        local = LocalRequest.start(self, request, [*self.config.eos_token_ids, self._tokenizer.eos_token_id])
        ids = local.ids
        static = self._static_prompt(request, ids)
        tokens = self._tokenizer.convert_ids_to_tokens(ids[len(static):])
        local.cached_tokens = len(static) if static in self._seen_static_prompts else 0
        job = Job(request.request_id, tokens, request.params.n, local.limit, self._options(request, local.end_ids),
                  static or None, channel)
        local.read_on(channel, partial(self._events, local, job, static))
        with self._counts_lock:
            self._requests += 1
            self._static_prompt_hits += bool(local.cached_tokens)
        self._batcher.submit(job)

    def _events(self, local: LocalRequest, job: Job, static: tuple[str, ...], item: tuple) -> list[Event]:
        """One raw item's events (the consumer's output stage, local_stream.LocalRequest.read)."""
        kind, *payload = item
        if kind == "token":
            index, token_id, logprob, at = payload
            choice = local.choices[index]
            if choice.done:
                return []
            events = [choice.on_token(token_id, logprob, at=at)]
            if choice.done:  # ended here (a stop string): its row stops at its next step (never un-stopped: close)
                job.stopped[index] = True
        else:  # "end": the job is over, and what is still open ends with its reason (length, error, abort)
            reason, error, at = payload
            events = [choice.finish(reason, error, at=at) for choice in local.choices if not choice.done]
        if static and local.done:
            self._seen_static_prompts.add(static)
        return events

    async def abort(self, request_id: str) -> None:
        self._batcher.cancel(request_id)

    def cancel_now(self, request_id: str) -> None:
        self._batcher.cancel(request_id)

    def stats(self) -> dict[str, Any]:
        hits = self._static_prompt_hits
        return {
            "running": self._batcher.running,
            "waiting": self._batcher.waiting,
            "batches": self._batcher.batches,
            "requests": self._requests,
            "prefix_hit_rate": hits / self._requests if self._requests else 0.0,
            "device": self.device,
            "compute_type": self.compute_type,
        }

    def close(self) -> None:
        """Later requests are refused; open ones end with BackendUnavailable. The batcher is kept: a late cancel
        finds nothing to do."""
        if self.closed:
            return
        super().close()
        if getattr(self, "_batcher", None) is not None:
            self._batcher.close()

    # --- helpers --------------------------------------------------------------------
    def _static_prompt(self, request: Request, ids: list[int]) -> tuple[str, ...]:
        """The system turn's tokens when the chat opens with one: CTranslate2 caches its state."""
        messages = request.messages
        if not messages or messages[0].get("role") != "system" or len(messages) < 2:
            return ()
        try:  # the profile's template when it sets one, like the prompt itself
            text = self.apply_chat_template(messages[:1], request.tools)
        except RequestError:
            return ()  # a template that needs more than the system turn: no static prompt
        system_ids = self._tokenizer.encode(text, add_special_tokens=False)
        # The rendering ends with the assistant's turn, where the prompt goes on with the next
        # message: the static part is what both share (ids[:k] itself, so always a safe split).
        k = next((i for i, (a, b) in enumerate(zip(system_ids, ids)) if a != b), min(len(system_ids), len(ids)))
        return tuple(self._tokenizer.convert_ids_to_tokens(ids[:k])) if 0 < k < len(ids) else ()

    def _options(self, request: Request, end_ids: set[int]) -> tuple:
        p = request.params
        options = {
            "min_length": p.min_tokens,
            "end_token": sorted(end_ids),
            "repetition_penalty": p.repetition_penalty,
            "sampling_topk": 1 if p.greedy else max(p.top_k, 0),
            "sampling_topp": p.top_p,
            "sampling_temperature": 1.0 if p.greedy else p.temperature,
            "return_scores": p.logprobs is not None,
        }
        # Hashable, so jobs with equal options can share one generate_batch call (max_length is
        # left out: the batch takes its jobs' largest, and each ChoiceOutput stops at its own).
        return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(options.items()))

def device_and_compute_type(profile: Profile, plan: Plan) -> tuple[str, str]:
    """The plan's device and compute type, checked against what CTranslate2 offers on it.

    A compute type the resolver chose (the profile says "auto") falls back to the closest one
    this device supports; one the profile pins must be supported, or it is an error.
    """
    import ctranslate2

    device = "cuda" if plan.device.startswith("cuda") else "cpu"
    compute = plan.compute_type or "auto"
    supported = ctranslate2.get_supported_compute_types(device)
    if compute in supported or compute == "auto":
        return device, compute
    if profile.ctranslate2.compute_type == "auto":
        fallback = "int8" if compute.startswith("int8") else "float32"
        return device, fallback if fallback in supported else "auto"
    raise BackendUnavailable(
        f"CTranslate2 cannot compute in {compute} on {device} here; it supports "
        f"{', '.join(sorted(supported))}. Set [ctranslate2] compute_type to one of them"
    )


def _device_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)
