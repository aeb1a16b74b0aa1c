"""RoPE tables: fp32 cos and signed sin for every position, with HF's rope_scaling kinds (linear, llama3, yarn)."""

from __future__ import annotations

import math

import torch

from inferplug.models.config import ModelConfig


def rope_tables(config: ModelConfig, device: torch.device, *, theta: float | None = None,
                scaling: dict | None | bool = True, dim: int | None = None,
                positions: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and signed sin (see ops/torch_ops.apply_rope) for every position up to `positions` (0: the config's
    max_position_embeddings): [positions, head_dim]. `theta`, `scaling` and `dim` replace the config's (a sliding
    layer's own base, unscaled; Gemma 4's layers of another head size)."""
    dim = dim or config.head_dim
    base = config.rope_theta if theta is None else theta
    scaling = config.rope_scaling if scaling is True else scaling
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq, magnitude = scale_inv_freq(inv_freq, scaling, base, dim, config.max_position_embeddings)
    positions = torch.arange(positions or config.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, signed_sin = emb.cos(), torch.cat((-freqs.sin(), freqs.sin()), dim=-1)
    if magnitude != 1.0:  # YaRN's attention factor, on cos and sin as HF applies it
        cos, signed_sin = cos * magnitude, signed_sin * magnitude
    return cos.to(device), signed_sin.to(device)


def scale_inv_freq(inv_freq: torch.Tensor, scaling: dict | None, base: float, dim: int,
                   max_positions: int) -> tuple[torch.Tensor, float]:
    """HF rope_scaling applied: 'linear', 'llama3', 'yarn', 'proportional' and 'partial'; 'default' or none leaves it
    alone.
    Returns the frequencies and the factor on cos and sin (YaRN's; 1 for the others)."""
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "default":
        return inv_freq, 1.0
    if kind == "partial":  # Qwen3.5: the first pairs rotate at frequencies of the rotated width, the rest stay
        rotated = int(float(scaling["partial_rotary_factor"]) * dim)  # (its decoder moves those dims to the pairs)
        own = 1.0 / (base ** (torch.arange(0, rotated, 2, dtype=torch.int64).float() / rotated))
        return torch.cat([own, torch.zeros(len(inv_freq) - len(own))]), 1.0
    if kind == "proportional":  # Gemma 4's full layers: a fraction of each half rotates, the rest is left as it is
        rotated = int(float(scaling.get("partial_rotary_factor", 1.0)) * dim // 2)
        kept = torch.cat([inv_freq[:rotated], torch.zeros(len(inv_freq) - rotated)])
        return kept / float(scaling.get("factor", 1.0)), 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, scaling, factor, base, dim, max_positions)
    raise ValueError(f"rope_scaling type {kind!r} is not supported; use a model with default, linear, llama3, "
                     "yarn, proportional or partial RoPE")


def _yarn(inv_freq: torch.Tensor, scaling: dict, factor: float, base: float, dim: int,
          max_positions: int) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as HF's _compute_yarn_parameters: high frequencies kept, low ones interpolated by
    `factor`, a linear ramp between the dims that turn beta_fast and beta_slow times over the original context
    (the config's original_max_position_embeddings, else its max_position_embeddings, as HF's default); the ramp's
    bounds rounded out to whole dims unless the config says `truncate: false`."""
    old_len = float(scaling.get("original_max_position_embeddings") or max_positions)
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def dim_of(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(fast), dim_of(slow)
    if scaling.get("truncate", True):  # HF's default; gpt-oss's config turns it off
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    mixed = inv_freq / factor * (1 - extrapolated) + inv_freq * extrapolated
    magnitude = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return mixed, float(magnitude)


def partial_rope_order(head_dim: int, factor: float) -> torch.Tensor:
    """The head dims in the order that lets partial RoPE (HF's: the first `factor` of a head rotates, dim i with
    i + rotated / 2) run on full-width tables, whose pairs are (i, i + head_dim / 2): the rotated halves go to the
    pairs' first slots, the dims left alone after each. q and k rows (and their norms) permuted alike leave every
    score as it was; the "partial" tables (scale_inv_freq) give the pairs past the rotated ones frequency 0."""
    rotated, half = int(factor * head_dim) // 2, head_dim // 2
    kept = torch.arange(2 * rotated, head_dim)
    return torch.cat([torch.arange(rotated), kept[: half - rotated], torch.arange(rotated, 2 * rotated),
                      kept[half - rotated:]])
