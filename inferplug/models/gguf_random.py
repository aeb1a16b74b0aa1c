"""Random but well-formed GGUF blocks of any type, at a chosen spread: the dummy load format's weights and the
tests' inputs (gguf-py quantizes no K-quant, so those are made from random bytes with sane fp16 scales)."""

from __future__ import annotations

import torch

from inferplug.models.gguf import GGML_TYPES
from inferplug.models.gguf_dequant import dequantize

# Each type's fp16 fields: (byte offset of the scale d, byte offset of the min or None, the min as a multiple of d
# that centres the values: the codes' mean times the sub-scales' mean over the mins' mean).
_FP16_FIELDS = {
    "Q4_0": (0, None, 0.0), "Q5_0": (0, None, 0.0), "Q8_0": (0, None, 0.0),
    "Q4_1": (0, 2, -7.5), "Q5_1": (0, 2, -15.5),
    "Q2_K": (80, 82, 1.5), "Q3_K": (108, None, 0.0), "Q4_K": (0, 2, 7.5), "Q5_K": (0, 2, 15.5), "Q6_K": (208, None, 0.0),
}
RANDOM_TYPES = tuple(_FP16_FIELDS)


def random_blocks(type_name: str, shape: tuple[int, int], std: float, generator: torch.Generator) -> torch.Tensor:
    """uint8 [rows, row bytes] of `type_name` blocks whose values have about mean 0 and standard deviation `std`."""
    rows, cols = shape
    _, block_elems, block_bytes = GGML_TYPES[type_name]
    raw = torch.randint(0, 256, (rows * cols // block_elems, block_bytes), dtype=torch.uint8, generator=generator)
    scale_at, min_at, min_per_scale = _FP16_FIELDS[type_name]
    d = torch.empty(raw.shape[0], 1).uniform_(0.5, 1.0, generator=generator)

    def set_fields(d: torch.Tensor) -> None:
        raw[:, scale_at:scale_at + 2] = d.half().view(torch.uint8)
        if min_at is not None:
            raw[:, min_at:min_at + 2] = (d * min_per_scale).half().view(torch.uint8)

    set_fields(d)
    sample = min(raw.shape[0], 4096)
    spread = dequantize(raw[:sample].reshape(-1), type_name, (sample * block_elems,), block_bytes).std().item()
    set_fields(d * (std / spread))
    return raw.reshape(rows, -1)


def q4_k_m_type(gguf_name: str, layer: int, num_layers: int) -> str:
    """The ggml type llama.cpp's Q4_K_M gives a tensor (llama-quant.cpp): Q6_K for the output, and for attn_v and
    ffn_down in the layers `use_more_bits` picks (the first and last eighth, every third between); Q4_K elsewhere."""
    more_bits = layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2
    if gguf_name == "output.weight" or (more_bits and (".attn_v." in gguf_name or ".ffn_down." in gguf_name)):
        return "Q6_K"
    return "Q4_K"


def write_random_gguf(out, config, tokenizer_metadata: dict, type_of=q4_k_m_type, seed: int = 0) -> None:
    """A llama-architecture GGUF of random weights at `config`'s geometry (models/config.ModelConfig): each matrix
    of `type_of(name, layer, layers)`, each of spread 1 / sqrt(inputs) so activations stay near unit size, F32 norms
    of ones, and `tokenizer_metadata` (a GGUF's "tokenizer.*" keys) for its vocabulary. Written a tensor at a time."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(out, "llama")
    for add, value in ((writer.add_block_count, config.num_hidden_layers),
                       (writer.add_context_length, config.max_position_embeddings),
                       (writer.add_embedding_length, config.hidden_size),
                       (writer.add_feed_forward_length, config.intermediate_size),
                       (writer.add_head_count, config.num_attention_heads),
                       (writer.add_head_count_kv, config.num_key_value_heads),
                       (writer.add_rope_freq_base, config.rope_theta),
                       (writer.add_layer_norm_rms_eps, config.rms_norm_eps),
                       (writer.add_vocab_size, config.vocab_size)):  # fmt: skip
        add(value)
    for key, value in tokenizer_metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)
    generator = torch.Generator().manual_seed(seed)
    hidden, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    layer_shapes = {"attn_q": (config.num_attention_heads * config.head_dim, hidden), "attn_k": (kv, hidden),
                    "attn_v": (kv, hidden), "attn_output": (hidden, config.num_attention_heads * config.head_dim),
                    "ffn_gate": (config.intermediate_size, hidden), "ffn_up": (config.intermediate_size, hidden),
                    "ffn_down": (hidden, config.intermediate_size)}  # fmt: skip
    matrices = [("token_embd.weight", 0, (config.vocab_size, hidden)), ("output.weight", config.num_hidden_layers - 1,
                (config.vocab_size, hidden))]
    matrices += [(f"blk.{i}.{part}.weight", i, shape) for i in range(config.num_hidden_layers)
                 for part, shape in layer_shapes.items()]
    norms = ["output_norm.weight", *(f"blk.{i}.{n}.weight" for i in range(config.num_hidden_layers)
                                     for n in ("attn_norm", "ffn_norm"))]
    # the writer keeps what it is given until written, so the tensors are added lazily: one in memory at a time
    for name in norms:
        writer.add_tensor_info(name, (hidden,), np.dtype(np.float32), hidden * 4)
    for name, layer, (rows, cols) in matrices:
        qtype = gguf.GGMLQuantizationType[type_of(name, layer, config.num_hidden_layers)]
        nbytes = rows * cols // gguf.GGML_QUANT_SIZES[qtype][0] * gguf.GGML_QUANT_SIZES[qtype][1]
        writer.add_tensor_info(name, (rows, nbytes // rows), np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _ in norms:
        writer.write_tensor_data(np.ones(hidden, dtype=np.float32))
    for name, layer, (rows, cols) in matrices:
        blocks = random_blocks(type_of(name, layer, config.num_hidden_layers), (rows, cols), cols**-0.5, generator)
        writer.write_tensor_data(blocks.numpy())
    writer.close()
