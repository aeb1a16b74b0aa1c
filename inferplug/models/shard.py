"""Each rank's slice of a checkpoint of any family (HF names; an MoE's experts each split as a dense MLP is; gpt-oss's
sinks by head, and its row-parallel biases a 1 / tp share on each rank; Gemma 4's layers by their own KV heads, its
per-layer table by vocabulary, its scales whole), and the check that a TP size splits the model."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unimported for the resolver's check
    import torch

    from inferplug.models.config import ModelConfig

COLUMN = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "mlp", "up_proj": "mlp"}  # output rows
ROW = {"o_proj": "q", "down_proj": "mlp"}  # input columns: partial sums, all-reduced


def check_tensor_parallel(num_heads: int, num_kv_heads: int, tp: int, family: str = "",
                          layer_kv_heads: tuple[int, ...] = ()) -> str | None:
    """Why `tp` cannot split these heads, or this family (None: it can). `layer_kv_heads`: each layer's KV heads
    where layers differ (Gemma 4's full layers). Whole heads per rank keep attention local; we do not replicate KV
    heads (vLLM does when tp > KV heads) since that multiplies the pool for no speed on a CPU."""
    from inferplug.models.registry import family as family_of

    if tp < 1:
        return f"tensor_parallel_size = {tp} must be at least 1"
    unsplit = family_of(family).tensor_parallel_why if family and tp > 1 else ""
    if unsplit:
        return f"tensor parallel does not split a {family} model yet ({unsplit}); set tensor_parallel_size = 1"
    counts = (num_heads, num_kv_heads, *layer_kv_heads)
    for what, heads in (("attention heads", num_heads), ("KV heads", num_kv_heads),
                        *(("KV heads in some layers", n) for n in sorted(set(layer_kv_heads)))):
        if heads % tp:
            sizes = [n for n in range(1, heads + 1) if all(c % n == 0 for c in counts)]
            return (f"tensor_parallel_size = {tp} does not divide the model's {heads} {what} (each rank holds whole "
                    f"heads); use one of {sizes}")
    return None


def rank_config(config: ModelConfig, tp: int) -> ModelConfig:
    """The architecture one rank runs: its share of the heads (intermediate size and vocabulary are sliced below)."""
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // tp,
                               num_key_value_heads=config.num_key_value_heads // tp,
                               layer_kv_heads=tuple(n // tp for n in config.layer_kv_heads))


def shard_weights(config: ModelConfig, state_dict: dict[str, torch.Tensor], rank: int, tp: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s tensors (copies, so the full checkpoint can go): a ProfileError for weights that are
    already packed layers (AWQ / GPTQ), which cannot be sliced."""
    import torch

    from inferplug.errors import ProfileError

    widths = {"q": config.num_attention_heads * config.head_dim, "kv": config.num_key_value_heads * config.head_dim,
              "mlp": config.intermediate_size}
    out = {}
    for name, w in state_dict.items():
        if not isinstance(w, torch.Tensor):
            raise ProfileError(f"tensor parallel slices float or GGUF weights, not the packed layer {name!r} of an AWQ "
                               "/ GPTQ checkpoint; set tensor_parallel_size = 1")
        module = name.rsplit(".", 2)[-2]
        if name.endswith(".scale"):  # Gemma 4's router input and expert output scales: whole on every rank
            pass
        elif module in COLUMN:  # the weight's rows, or the bias; an MoE expert's are its own width
            width = config.moe_intermediate_size if ".experts." in name else widths[COLUMN[module]]
            w = w.chunk(tp, dim=0)[rank] if width % tp == 0 else _bad(name, tp)
        elif module in ROW and name.endswith("weight"):
            width = config.moe_intermediate_size if ".experts." in name else w.shape[1]
            w = w.chunk(tp, dim=1)[rank] if width % tp == 0 else _bad(name, tp)
        elif module in ROW:  # a row-parallel bias: each rank adds its share to its partial sum, the all-reduce the whole
            w = w / tp
        elif name.endswith(".self_attn.sinks"):  # one per query head: the rank's heads'
            w = w.chunk(tp, dim=0)[rank]
        elif name in ("model.embed_tokens.weight", "lm_head.weight", "model.embed_tokens_per_layer.weight"):
            # by vocabulary, the last rank's slice padded with zero rows; Gemma 4's per-layer table too (the embedding's
            # lookup reads it, and E2B's is 2.3B parameters)
            rows = -(-w.shape[0] // tp)
            w = torch.nn.functional.pad(w, (0, 0, 0, rows * tp - w.shape[0]))[rank * rows:(rank + 1) * rows]
        out[name] = w.clone()
    return out


def _bad(name: str, tp: int):
    from inferplug.errors import ProfileError

    raise ProfileError(f"tensor_parallel_size = {tp} does not divide {name}; use a size that divides it")
