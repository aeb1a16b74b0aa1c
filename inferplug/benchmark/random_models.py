"""Real-size model files of random weights, written a tensor at a time: a Q4_K_M-style GGUF (gguf-py) and AutoAWQ
GEMM / GPTQ act-order checkpoints (4-bit, group 128), for bench/real_size.py and the tests that load a few layers at
7B width. The weights have spread 1 / sqrt(inputs), so activations stay near unit size through every layer.

    write_random_gguf(out, config, tokenizer_metadata, type_of=q4_k_m_type)
    write_random_checkpoint(out, config, "awq" | "gptq" | "bf16", tokenizer=None)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from inferplug.models.config import ModelConfig
from inferplug.models.gguf_random import q4_k_m_type, random_blocks

GROUP = 128  # the checkpoints' group size


def write_random_gguf(out, config: ModelConfig, tokenizer_metadata: dict, type_of=q4_k_m_type, seed: int = 0) -> None:
    """A GGUF of `config.architecture` ("llama", "qwen3" with its QK-norm weights, "qwen3moe" with an MoE in every
    layer: an F32 router, 3-D expert tensors; "gpt-oss": its MoE with biases everywhere, attention sinks, YaRN and
    alternating windows, in the mix its files ship, `gpt_oss_type`; or "gemma3": QK and sandwich norms, five window
    layers to a full one, linear RoPE scaling, the embedding tied to the head) at `config`'s geometry: each matrix of
    `type_of(name, layer, layers)`, F32 norms of ones, and `tokenizer_metadata` (a GGUF's "tokenizer.*" keys, as
    models/gguf.read_gguf gives them)."""
    import gguf

    gpt_oss, gemma3 = config.architecture == "gpt-oss", config.architecture == "gemma3"
    type_of = gpt_oss_type if gpt_oss else type_of
    writer = gguf.GGUFWriter(out, config.architecture)
    add_geometry(writer, config, config.num_key_value_heads)
    for add, value in ((writer.add_rope_dimension_count, config.head_dim),
                       (writer.add_key_length, config.head_dim), (writer.add_value_length, config.head_dim)):  # fmt: skip
        add(value)
    experts = config.num_experts
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if gpt_oss:  # gpt-oss-20b's: a 128-token window on every other layer, YaRN 32x over 4096
        writer.add_sliding_window(GPT_OSS_WINDOW)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(32.0)
        writer.add_rope_scaling_orig_ctx_len(4096)
    if gemma3:  # 4B and up: 1,024-token windows, the full layers' RoPE scaled 8x (linear)
        writer.add_sliding_window(config.kv_window())
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(config.rope_scaling["factor"])
    add_metadata(writer, tokenizer_metadata)
    layers, hidden = config.num_hidden_layers, config.hidden_size
    parts = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}  # fmt: skip
    shapes = config.linear_shapes()
    matrices = [("token_embd.weight", 0, (config.vocab_size, hidden))] + \
        ([] if gemma3 else [("output.weight", layers - 1, (config.vocab_size, hidden))])
    if experts:  # each expert tensor (experts, out, in): its experts' matrices one after another
        inter = config.moe_intermediate_size
        parts = {part: module for part, module in parts.items() if not part.startswith("ffn_")}
        parts |= {"ffn_gate_exps": (experts * inter, hidden), "ffn_up_exps": (experts * inter, hidden),
                  "ffn_down_exps": (experts * hidden, inter)}
    matrices += [(f"blk.{i}.{part}.weight", i, module if isinstance(module, tuple) else shapes[module])
                 for i in range(layers) for part, module in parts.items()]
    # the F32 tensors: (name, shape, spread; None for ones: the norms)
    post_norm = "post_attention_norm" if gpt_oss else "ffn_norm"
    floats = [("output_norm.weight", (hidden,), None),
              *((f"blk.{i}.{n}.weight", (hidden,), None) for i in range(layers) for n in ("attn_norm", post_norm))]
    if config.architecture in ("qwen3", "qwen3moe", "gemma3"):
        floats += [(f"blk.{i}.{n}.weight", (config.head_dim,), None) for i in range(layers)
                   for n in ("attn_q_norm", "attn_k_norm")]
    if gemma3:
        floats += [(f"blk.{i}.{n}.weight", (hidden,), None) for i in range(layers)
                   for n in ("post_attention_norm", "post_ffw_norm")]
        type_of = tied_head(type_of)
    if experts:
        floats += [(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), hidden**-0.5) for i in range(layers)]
    if gpt_oss:  # biases of a small spread, and sinks (one logit a head)
        q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
        biases = {"attn_q": (q,), "attn_k": (kv,), "attn_v": (kv,), "attn_output": (hidden,),
                  "ffn_gate_inp": (experts,), "ffn_gate_exps": (experts, inter), "ffn_up_exps": (experts, inter),
                  "ffn_down_exps": (experts, hidden)}  # fmt: skip
        floats += [(f"blk.{i}.{part}.bias", shape, 0.02) for i in range(layers) for part, shape in biases.items()]
        floats += [(f"blk.{i}.attn_sinks.weight", (config.num_attention_heads,), 1.0) for i in range(layers)]
    write_tensors(writer, floats, matrices, lambda name, layer: type_of(name, layer, layers), experts, seed)


def tied_head(type_of):
    """A mix whose embedding is also the head (Gemma's): the embedding in the head's type, Q6_K."""
    return lambda name, layer, layers: "Q6_K" if name == "token_embd.weight" else type_of(name, layer, layers)


def add_geometry(writer, config: ModelConfig, kv_heads) -> None:
    """The keys every architecture's header has: depth, context, widths, heads (`kv_heads`: one count or one a
    layer), RoPE base, norm epsilon, vocabulary."""
    for add, value in ((writer.add_block_count, config.num_hidden_layers),
                       (writer.add_context_length, config.max_position_embeddings),
                       (writer.add_embedding_length, config.hidden_size),
                       (writer.add_feed_forward_length, config.intermediate_size),
                       (writer.add_head_count, config.num_attention_heads), (writer.add_head_count_kv, kv_heads),
                       (writer.add_rope_freq_base, config.rope_theta),
                       (writer.add_layer_norm_rms_eps, config.rms_norm_eps),
                       (writer.add_vocab_size, config.vocab_size)):  # fmt: skip
        add(value)


def add_metadata(writer, metadata: dict) -> None:
    """GGUF keys as read_gguf gives them (a GGUF's "tokenizer.*" keys): lists, bools, ints and strings."""
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)


def write_tensors(writer, floats: list, matrices: list, type_of, experts: int, seed: int) -> None:
    """The header, then each tensor's data, one in memory at a time (the writer holds what it is given until it
    writes, so tensors go in as infos first): `floats` as (name, shape, spread; None for ones) in F32, `matrices` as
    (name, layer, (rows, cols)) random blocks of type_of(name, layer), an MoE's "_exps." ones 3-D by expert. A
    float's spread may be its values instead (a numpy array)."""
    import gguf
    import numpy as np

    for name, shape, _ in floats:
        writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    for name, layer, (rows, cols) in matrices:
        qtype = gguf.GGMLQuantizationType[type_of(name, layer)]
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = rows * cols // block_elems * block_bytes
        shape = (experts, rows // experts, nbytes // rows) if "_exps." in name else (rows, nbytes // rows)
        writer.add_tensor_info(name, shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    generator = torch.Generator().manual_seed(seed)
    for _, shape, std in floats:
        if isinstance(std, np.ndarray):
            writer.write_tensor_data(std.astype(np.float32))
        else:
            writer.write_tensor_data(np.ones(shape, dtype=np.float32) if std is None
                                     else (torch.randn(shape, generator=generator) * std).numpy())
    for name, layer, (rows, cols) in matrices:
        blocks = random_blocks(type_of(name, layer), (rows, cols), cols**-0.5, generator)
        writer.write_tensor_data(blocks.numpy().reshape(experts, rows // experts, -1) if "_exps." in name else blocks.numpy())
    writer.close()


GPT_OSS_WINDOW = 128


def gpt_oss_type(gguf_name: str, layer: int, num_layers: int) -> str:
    """The ggml type of a tensor in gpt-oss's own GGUFs (ggml-org's gpt-oss-20b-mxfp4): MXFP4 experts, Q8_0 for the
    rest (attention, embedding, head)."""
    return "MXFP4" if "_exps." in gguf_name else "Q8_0"


def write_random_checkpoint(out: Path, config: ModelConfig, method: str, tokenizer=None, seed: int = 0) -> Path:
    """An AutoAWQ GEMM ("awq") or GPTQ v1 act-order ("gptq") checkpoint, or an unquantized one in bf16 ("bf16", as
    most HF releases ship), one decoder layer a shard (a 7B one never sits in memory whole), with config.json and
    `tokenizer` (saved with save_pretrained) when given. Random int32 words are valid codes and zeros; the fp16
    scales give (q - z) * s spread 1 / sqrt(inputs), as the bf16 weights are spread."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}

    def save(tensors: dict, name: str) -> None:
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))

    vocab, hidden = config.vocab_size, config.hidden_size
    floats = torch.bfloat16 if method == "bf16" else torch.float16
    save({"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=generator).to(floats),
          "model.norm.weight": torch.ones(hidden, dtype=floats),
          "lm_head.weight": (torch.randn(vocab, hidden, generator=generator) * hidden**-0.5).to(floats)},
         "model-floats.safetensors")
    for i in range(config.num_hidden_layers):
        shard = {f"model.layers.{i}.{norm}.weight": torch.ones(hidden, dtype=floats)
                 for norm in ("input_layernorm", "post_attention_layernorm")}
        orders: dict[str, torch.Tensor] = {}  # GPTQ orders inputs by their Hessian: q/k/v (gate/up) share one
        for module, (rows, cols) in config.linear_shapes().items():
            shared = config.shared_input(module)
            if method == "gptq" and shared not in orders:
                orders[shared] = (torch.arange(cols) // GROUP)[torch.randperm(cols, generator=generator)]
            for part, tensor in _packed_linear(method, rows, cols, orders.get(shared), generator).items():
                shard[f"model.layers.{i}.{module}.{part}"] = tensor
        save(shard, f"model-layer{i:03d}.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    quant = {"awq": {"quant_method": "awq", "bits": 4, "group_size": GROUP, "zero_point": True, "version": "gemm"},
             "gptq": {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": True, "sym": False,
                      "checkpoint_format": "gptq"}}.get(method)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
          "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_hidden_layers,
          "num_attention_heads": config.num_attention_heads, "num_key_value_heads": config.num_key_value_heads,
          "head_dim": config.head_dim, "max_position_embeddings": config.max_position_embeddings,
          "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta, "tie_word_embeddings": False,
          "torch_dtype": str(floats).removeprefix("torch."), **({"quantization_config": quant} if quant else {})}
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
        hf.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    return out


def _packed_linear(method: str, rows: int, cols: int, g_idx, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """One linear's qweight / qzeros / scales (/ g_idx) as AutoAWQ GEMM or GPTQ pack them (quant/group_int4.py), or
    its bf16 weight. Uniform random nibbles: (q - z) has variance 42.5."""
    groups = cols // GROUP

    def words(*shape):
        return torch.randint(-(1 << 31), 1 << 31, shape, dtype=torch.int32, generator=generator)

    if method == "bf16":
        return {"weight": (torch.randn(rows, cols, generator=generator) * cols**-0.5).bfloat16()}
    scales = ((42.5 * cols) ** -0.5 * torch.empty(groups, rows).uniform_(0.75, 1.25, generator=generator)).half()
    if method == "awq":
        return {"qweight": words(cols, rows // 8), "qzeros": words(groups, rows // 8), "scales": scales}
    return {"qweight": words(cols // 8, rows), "qzeros": words(groups, rows // 8), "scales": scales,
            "g_idx": g_idx.to(torch.int32).clone()}
