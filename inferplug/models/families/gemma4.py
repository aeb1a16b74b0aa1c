"""Gemma 4 (E2B, E4B, 26B-A4B, 31B): Gemma 3's decoder (sandwich norms, QK-norm, GeGLU, windowed and full layers,
the embedding times sqrt(hidden), a final soft-cap), with
- norms used as stored (no 1 + w), attention scaled by 1, and an RMSNorm without a scale on V;
- per-layer geometry: the full layers have their own head size and KV-head count, and there V is K's projection
  where the config says attention_k_eq_v;
- proportional partial RoPE on the full layers (a quarter of each half rotates), plain RoPE on the window layers;
- shared KV: the last num_kv_shared_layers layers attend over the KV of the last earlier layer of their kind;
- per-layer input embeddings (E2B / E4B): a small table per layer, mixed with a projection of the embedding, gated
  into the residual after the MLP; and each layer's output scaled by its layer_scalar.
HF's modeling_gemma4.py and llama.cpp's src/models/gemma4-iswa.cpp are the references."""

import dataclasses
from typing import Any

from inferplug.models.families import gemma3

SLIDING_PATTERN = 6  # HF's default layer_types: every sixth layer full


def shared_kv_sources(kinds: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV source: itself, or for the last `shared` layers the last earlier own-KV layer of its kind."""
    first = len(kinds) - shared
    owner = {kind: max(i for i in range(first) if kinds[i] == kind) for kind in set(kinds[first:])}
    return tuple(i if i < first else owner[kinds[i]] for i in range(len(kinds)))


def layer_geometry(kinds: list[str], window: int, swa_dim: int, full_dim: int, kv_heads: list[int], shared: int,
                   k_eq_v: list[bool]) -> dict[str, Any]:
    """The ModelConfig fields of Gemma 4's per-layer geometry, from each layer's kind ("sliding_attention" or
    "full_attention"), the two head sizes, each layer's KV heads, the shared layers' count and the V-from-K layers."""
    sources = shared_kv_sources(kinds, shared)
    return {"layer_windows": tuple(window if kind == "sliding_attention" else 0 for kind in kinds),
            "sliding_window": None,  # per layer instead
            "layer_head_dims": tuple(swa_dim if kind == "sliding_attention" else full_dim for kind in kinds),
            "layer_kv_heads": tuple(kv_heads), "kv_sources": sources,
            "v_from_k": tuple(k_eq_v[i] and sources[i] == i for i in range(len(kinds))),
            "attention_scale": 1.0}


def hf_fields(raw: dict[str, Any]) -> dict[str, Any]:
    layers, heads = raw["num_hidden_layers"], raw["num_attention_heads"]
    kinds = raw.get("layer_types") or ["full_attention" if (i + 1) % SLIDING_PATTERN == 0 else "sliding_attention"
                                       for i in range(layers)]
    swa_dim, swa_kv = raw.get("head_dim") or raw["hidden_size"] // heads, raw.get("num_key_value_heads") or heads
    # the full layers' geometry: per_layer_config as HF writes it, or the released configs' global_* fields
    per_layer = {int(i): c for i, c in (raw.get("per_layer_config") or {}).items()}
    full = next((per_layer[i] for i, kind in enumerate(kinds) if kind == "full_attention" and i in per_layer), {})
    full_dim = full.get("head_dim") or raw.get("global_head_dim") or swa_dim
    k_eq_v = bool(raw.get("attention_k_eq_v"))
    full_kv = full.get("num_key_value_heads") or (raw.get("num_global_key_value_heads") if k_eq_v else None) or swa_kv
    rope = raw.get("rope_parameters") or {}
    return {**layer_geometry(kinds, raw.get("sliding_window") or 0, swa_dim, full_dim,
                             [swa_kv if kind == "sliding_attention" else full_kv for kind in kinds],
                             raw.get("num_kv_shared_layers") or 0,
                             [k_eq_v and kind == "full_attention" for kind in kinds]),
            "rope_local_theta": float((rope.get("sliding_attention") or {}).get("rope_theta", 10000.0)),
            "final_logit_softcap": raw.get("final_logit_softcapping"),
            "per_layer_input_size": raw.get("hidden_size_per_layer_input") or 0,
            # E2B: the layers that read another's KV run an MLP twice as wide
            "layer_intermediate_sizes": tuple(raw["intermediate_size"] * (2 if raw.get("use_double_wide_mlp") and
                                                                          source != i else 1)
                                              for i, source in enumerate(shared_kv_sources(
                                                  kinds, raw.get("num_kv_shared_layers") or 0))),
            **(moe_fields(layers, raw["num_experts"], raw["top_k_experts"], raw["moe_intermediate_size"])
               if raw.get("enable_moe_block") else {})}


def moe_fields(layers: int, experts: int, top_k: int, inter: int) -> dict[str, Any]:
    """26B-A4B: every layer's experts beside its dense MLP; the top k of a softmax, renormalized."""
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter,
            "norm_topk_prob": True, "moe_layers": tuple([True] * layers), "dense_beside_moe": True}


def gguf_fields(gguf) -> dict[str, Any]:
    import torch

    layers = gguf.arch_count("block_count")
    swa = gguf.arch_key("attention.sliding_window_pattern") or [True] * layers
    kinds = ["sliding_attention" if s else "full_attention" for s in swa]
    kv = gguf.arch_key("attention.head_count_kv")
    kv = list(kv) if isinstance(kv, (list, tuple)) else [kv] * layers
    shared = gguf.arch_key("attention.shared_kv_layers", 0)
    # a full layer without a V tensor takes V from K (llama.cpp's converter writes none for attention_k_eq_v)
    k_eq_v = [kind == "full_attention" and f"blk.{i}.attn_v.weight" not in gguf.tensors
              for i, kind in enumerate(kinds)]
    full_dim = gguf.arch_count("attention.key_length")
    scaling = None
    if "rope_freqs.weight" in gguf.tensors:  # the converter marks each unrotated pair with a 1e30 factor
        with open(gguf.path, "rb") as handle:
            factors = gguf.read_tensor(handle, gguf.tensors["rope_freqs.weight"]).view(torch.float32)
        scaling = {"rope_type": "proportional", "partial_rotary_factor": int((factors < 1e29).sum()) * 2 / full_dim}
    swa_dim = gguf.arch_count("attention.key_length_swa")
    return {**layer_geometry(kinds, gguf.arch_count("attention.sliding_window"), swa_dim, full_dim, kv, shared, k_eq_v),
            "num_key_value_heads": kv[0],
            "head_dim": swa_dim,
            "rope_scaling": scaling,
            "rope_local_theta": float(gguf.arch_key("rope.freq_base_swa", 10000.0)),
            "final_logit_softcap": gguf.arch_key("final_logit_softcapping"),
            "per_layer_input_size": gguf.arch_key("embedding_length_per_layer_input", 0),
            "layer_intermediate_sizes": tuple(ffn) if isinstance(ffn := gguf.arch_key("feed_forward_length"), list)
            else tuple([ffn] * layers),
            **(moe_fields(layers, gguf.arch_count("expert_count"), gguf.arch_count("expert_used_count"),
                    gguf.arch_count("expert_feed_forward_length")) if gguf.arch_key("expert_count") else {})}


def hf_weights(weights: dict[str, Any], experts: int) -> dict[str, Any]:
    """HF's Gemma 4 names as the decoder's: a multimodal checkpoint's language model as the text model's (its
    vision and audio towers left out), `layer_scalar` as a weight, and an MoE layer's router (`router.proj`, its
    input `scale`, `per_expert_scale`) and experts (`experts.gate_up_proj` [experts, 2 * inter, hidden], gate rows
    first; `experts.down_proj` [experts, hidden, inter]) as the decoder's router and per-expert matrices."""
    out = {}
    for name, tensor in weights.items():
        name = name.replace("model.language_model.", "model.")
        if name.startswith(("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")):
            continue
        layer, sep, tail = name.partition(".experts.")
        route, _, part = name.partition(".router.")
        if sep and tail == "gate_up_proj":
            for e in range(experts):
                gate, up = tensor[e].chunk(2)
                out[f"{layer}.mlp.experts.{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{layer}.mlp.experts.{e}.up_proj.weight"] = up.contiguous()
        elif sep and tail == "down_proj":
            for e in range(experts):
                out[f"{layer}.mlp.experts.{e}.down_proj.weight"] = tensor[e]
        elif part == "per_expert_scale":
            for e in range(experts):
                out[f"{route}.mlp.experts.{e}.down_proj.scale"] = tensor[e]
        elif part:
            out[f"{route}.mlp.gate.{'weight' if part == 'proj.weight' else part}"] = tensor
        else:
            out[name + ".weight" if name.endswith(".layer_scalar") else name] = tensor
    return out


FAMILY = dataclasses.replace(
    gemma3.FAMILY,  # its decoder, with these differences
    name="gemma4",
    hf_model_types=("gemma4_text",),
    gguf_architectures=("gemma4",),
    norms_plus_one=False,
    v_norm=True,
    end_tokens=("<turn|>", "<|tool_response>"),  # a turn's end, and a tool call's (the caller answers it)
    gguf_layer_names={**gemma3.FAMILY.gguf_layer_names, "inp_gate": "per_layer_input_gate",
                      "proj": "per_layer_projection", "post_norm": "post_per_layer_input_norm",
                      "layer_output_scale": "layer_scalar", "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
                      "post_ffw_norm_1": "post_feedforward_layernorm_1",
                      "post_ffw_norm_2": "post_feedforward_layernorm_2"},
    fused_decode=True,  # decode_layers takes its head sizes, shared KV, V from K, V's norm, per-layer inputs,
    # scales, and 26B-A4B's dense MLP beside the experts
    document_cache_why="a document's KV is stored as one tensor of every layer's, and Gemma 4's layers differ in shape",
    hf_fields=hf_fields,
    gguf_fields=gguf_fields,
    hf_weights=hf_weights,
)
