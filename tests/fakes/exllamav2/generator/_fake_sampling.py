"""The fake's sampler: the settings inferplug sends, with the semantics of ExLlamaV2 0.3.2's C++
sampler (exllamav2_ext/cpp/sampling.cpp: apply_rep_penalty_cpu, then sample_basic's temperature,
top-k, top-p, min-p, in that order). Any other setting left off its default raises, so no test can
pass by a setting the fake ignores."""

from __future__ import annotations

import torch

# sample_basic's other stages; the fake refuses to run with them on
_UNSUPPORTED = {"top_a": 0.0, "tfs": 0, "typical": 0, "skew": 0, "smoothing_factor": 0.0, "min_temp": 0,
                "max_temp": 0.0, "temperature_last": False, "mirostat": False, "token_bias": None,
                "cfg_scale": None, "dry_multiplier": 0.0, "xtc_probability": 0.0, "token_repetition_decay": 0}


def sample(logits: torch.Tensor, settings, sequence: list[int]) -> torch.Tensor:
    """The probabilities the next token is drawn from (the greedy ones are one-hot)."""
    on = [name for name, off in _UNSUPPORTED.items() if getattr(settings, name) != off]
    if on:
        raise NotImplementedError(f"the fake exllamav2 does not implement {on}")
    logits = logits.clone()
    _penalties(logits, settings, sequence)
    top_k = 1 if settings.temperature < 0.01 else settings.top_k  # as sample_basic: near-zero temperature is greedy
    if top_k == 1:
        return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).float()
    probs = torch.softmax(logits / settings.temperature, dim=-1)
    if 0 < top_k < probs.numel():
        probs[probs < probs.topk(top_k).values[-1]] = 0.0
    if 0.0 < settings.top_p < 1.0:
        # top_p_cpu: the most likely tokens whose mass stays <= top_p (at least one), after renormalising
        ordered, order = (probs / probs.sum()).sort(descending=True)
        over = ordered.cumsum(0) > settings.top_p
        over[0] = False
        probs[order[over]] = 0.0
    if 0.0 < settings.min_p < 1.0:
        probs[probs < settings.min_p * probs.max()] = 0.0
    return probs / probs.sum()


def _penalties(logits: torch.Tensor, settings, sequence: list[int]) -> None:
    """apply_rep_penalty_cpu over the last token_repetition_range tokens (-1: the whole sequence, prompt
    included): the repetition and presence penalties once per distinct token, frequency once per use."""
    window = sequence if settings.token_repetition_range == -1 else sequence[-settings.token_repetition_range:]
    if not window:
        return
    ids = torch.tensor(window)
    counts = torch.bincount(ids, minlength=logits.numel())[: logits.numel()].float()
    seen = counts > 0
    rep = settings.token_repetition_penalty
    logits[seen] = torch.where(logits[seen] > 0, logits[seen] / rep, logits[seen] * rep)
    logits -= settings.token_presence_penalty * seen.float() + settings.token_frequency_penalty * counts
