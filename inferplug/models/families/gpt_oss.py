"""gpt-oss (20b, 120b): a mixture of experts in every layer, and Llama's decoder with
- biases on q, k, v and o, on the router and on every expert;
- attention sinks: one learned logit per head joins each query's softmax and is then dropped;
- sliding-window and full layers alternating (window layers first), YaRN RoPE without truncated ramp bounds;
- a router whose top k raw logits are softmaxed (the same as a softmax over all, renormalized over the k);
- swiglu_oai experts: gate = min(g, 7), up = clamp(u, -7, 7), out = gate * sigmoid(1.702 * gate) * (up + 1).
HF's modeling_gpt_oss.py and llama.cpp's src/models/openai-moe-iswa.cpp are the references. HF ships each layer's
experts as two 3-D tensors (gate and up interleaved, [experts, in, out]), or the release's MXFP4 pairs of them
(models/mxfp4_checkpoint.py): hf_weights cuts them into the decoder's per-expert matrices."""

from typing import Any

from inferplug.models.family import Family

SLIDING_PATTERN = 2  # llama.cpp's set_swa_pattern(2): even layers windowed, odd ones full


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers, window = raw["num_hidden_layers"], raw.get("sliding_window") or 0
    kinds = raw.get("layer_types") or ["sliding_attention" if i % SLIDING_PATTERN == 0 else "full_attention"
                                       for i in range(layers)]
    return {"layer_windows": tuple(window if kind == "sliding_attention" else 0 for kind in kinds),
            "sliding_window": None,  # per layer instead
            "num_experts": raw["num_local_experts"], "num_experts_per_tok": raw["num_experts_per_tok"],
            "moe_intermediate_size": raw["intermediate_size"], "norm_topk_prob": True,
            "moe_layers": tuple([True] * layers)}


def gguf_fields(gguf) -> dict[str, Any]:
    layers, window = gguf.arch_count("block_count"), gguf.arch_count("attention.sliding_window")
    scaling = {"rope_type": "yarn", "factor": float(gguf.arch_key("rope.scaling.factor", 1.0)),
               "original_max_position_embeddings": gguf.arch_count("rope.scaling.original_context_length"),
               "beta_fast": float(gguf.arch_key("rope.scaling.yarn_beta_fast", 32.0)),
               "beta_slow": float(gguf.arch_key("rope.scaling.yarn_beta_slow", 1.0)),
               "truncate": False}  # gpt-oss's YaRN (HF's config says so; the GGUF has no key for it)
    return {"layer_windows": tuple(window if i % SLIDING_PATTERN == 0 else 0 for i in range(layers)),
            "sliding_window": None,
            "rope_scaling": scaling if gguf.arch_key("rope.scaling.type") == "yarn" else None,
            "num_experts": gguf.arch_count("expert_count"), "num_experts_per_tok": gguf.arch_count("expert_used_count"),
            "moe_intermediate_size": gguf.arch_count("expert_feed_forward_length"), "norm_topk_prob": True,
            "moe_layers": tuple([True] * layers)}


def hf_weights(weights: dict[str, Any], experts: int) -> dict[str, Any]:
    """HF's gpt-oss layout as the decoder's names: each layer's `mlp.experts.gate_up_proj` ([experts, hidden,
    2 * inter], gate and up columns interleaved) and `down_proj` ([experts, inter, hidden]), with their biases, cut
    into per-expert gate_proj / up_proj / down_proj matrices ([out, in]); the router `mlp.router` as `mlp.gate`.
    The release's MXFP4 experts (their `_blocks` and `_scales`, rows [out], gate and up rows interleaved) become
    MXFP4 layers in the file's bits. `weights` is consumed as it is cut, so a layer's experts are not held twice."""
    from inferplug.models.mxfp4_checkpoint import mxfp4_layer  # torch: the registry imports this module without it

    out = {}
    for name in list(weights):
        if name not in weights:  # a pair's scales, taken with its blocks
            continue
        tensor = weights.pop(name)
        head, sep, tail = name.partition(".mlp.experts.")
        if sep and tail in ("gate_up_proj_blocks", "down_proj_blocks"):
            scales = weights.pop(name.removesuffix("_blocks") + "_scales")
            rows = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2)} \
                if tail.startswith("gate_up") else {"down_proj": slice(None)}
            for e in range(experts):
                for proj, part in rows.items():
                    out[f"{head}.mlp.experts.{e}.{proj}.weight"] = mxfp4_layer(tensor[e, part], scales[e, part])
        elif sep and tail in ("gate_up_proj", "gate_up_proj_bias"):
            weight = tail == "gate_up_proj"
            kind = "weight" if weight else "bias"
            for e in range(experts):
                part = tensor[e].t() if weight else tensor[e]  # [2 * inter, hidden] or [2 * inter]
                out[f"{head}.mlp.experts.{e}.gate_proj.{kind}"] = part[0::2].contiguous()
                out[f"{head}.mlp.experts.{e}.up_proj.{kind}"] = part[1::2].contiguous()
        elif sep and tail in ("down_proj", "down_proj_bias"):
            weight = tail == "down_proj"
            for e in range(experts):
                out[f"{head}.mlp.experts.{e}.down_proj.{'weight' if weight else 'bias'}"] = \
                    tensor[e].t().contiguous() if weight else tensor[e]
        else:
            out[name.replace(".mlp.router.", ".mlp.gate.")] = tensor
    return out


FAMILY = Family(
    name="gpt_oss",
    hf_model_types=("gpt_oss",),
    gguf_architectures=("gpt-oss",),
    attention_sinks=True,
    all_biases=True,
    activation="swiglu_oai",
    end_tokens=("<|return|>", "<|call|>"),  # harmony: the answer's end, and a tool call's (the caller runs it)
    gguf_layer_names={"post_attention_norm": "post_attention_layernorm", "attn_sinks": "self_attn.sinks"},
    fused_decode=True,  # decode_layers takes its biases, sinks, windows, biased router and swiglu_oai experts
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
    hf_weights=hf_weights,
)
