"""What the native engine's weight-only formats store (no torch here: the resolver plans with it).

int8 and int4 are GGUF's Q8_0 and Q4_1 blocks on inferplug's CPU kernels: an fp16 scale (and for Q4_1
an fp16 min) per 32 inputs, so 8.5 and 5 bits. On CUDA, int8 keeps one scale per row (8 bits; the plan
counts 8.5, a little high). quantize_model leaves the embedding in the model dtype and gives the lm_head
its own format (a copy when tied to the embedding), `head_format`. On the CPU an int8 head takes x in two int8
parts, its rounding and its remainder's (about 15 bits), so the logits stay float-accurate (under int4 layers, a
Q8_0 head on one int8 rounding of x flipped SmolLM2's "Paris" to "L'Étoile", as an int4 head does).
"""

LAYER_BITS = {"fp16": 16.0, "int8": 8.5, "int4": 5.0}
# AWQ / GPTQ int4 checkpoints load as layers (quant/checkpoint_layers.py): repacked into Q4_1 blocks where the CPU
# kernels run (4.25 bits for groups of 128, a scale and min a group; else 5), else kept in groups: 4 bits + an fp16 scale and a uint8 zero per group (4.19 at group 128).
CHECKPOINT_FORMATS = ("awq", "gptq")
LOADED_AS_LAYERS = (*CHECKPOINT_FORMATS, "gguf")  # the loader builds their layers: quantize_model only adds the rest


def checkpoint_layer_bits(q4_blocks: bool, group_size: int = 128) -> float:
    if q4_blocks:  # groups of 128 keep one fp16 scale and min a group (Q4G128Linear); others repeat them per 32
        return 4 + 32 / group_size if group_size == 128 else LAYER_BITS["int4"]
    return 4 + 24 / group_size


def float_model_format(fmt: str) -> str:
    """The format a float model (a draft beside the target) is quantized to alike: `fmt`, but int4 beside an AWQ /
    GPTQ checkpoint, whose format only loads packed layers (its CPU layers are the same Q4_1 blocks)."""
    return "int4" if fmt in CHECKPOINT_FORMATS else fmt


def head_format(layer_format: str, device_kind: str) -> str:
    """The lm_head's format under `layer_format` layers: int8, but fp16 under fp16 layers on the CPU, whose
    greedy output must match fp32 (quantize_model still gives a GGUF's Q8_0 head Q8_0 blocks there: lossless)."""
    return "fp16" if device_kind == "cpu" and layer_format == "fp16" else "int8"


# GGUF block types our Q4_1 blocks hold exactly (Q4_0: its -8 d min is exact in fp16), and those Q8_0 holds exactly
# (Q5_0: its codes q - 16 are int8 with the same scale; pinned int8 takes that). Q4_K runs in blocks of its own
# ("q4_k": its scales exact, its 6-bit codes a byte each, 4.625 bits), Q5_K too ("q5_k", its codes a byte each, 5.625
# bits), Q6_K too ("q6_k", exactly, 6.5625 bits), and Q5_0 ("q5_0", exactly, 5.5 bits). Other quantized types run as
# Q8_0 blocks, requantized from their values (models/gguf_layers.py states and tests each error).
GGUF_Q4_SOURCES = ("Q4_0", "Q4_1", "Q4_K")
Q4_K_BITS = 4.625  # per 256 weights: fp16 d and dmin, 16 one-byte codes, 128 bytes of nibbles
Q5_K_BITS = 5.625  # per 256 weights: fp16 d and dmin, 16 one-byte codes, 128 bytes of nibbles, 32 of high bits
Q6_K_BITS = 6.5625  # per 256 weights: an fp16 d, 16 int8 scales, 192 bytes of 6-bit codes (the file's own)
Q5_0_BITS = 5.5  # per 32 weights: an fp16 d, 16 bytes of nibbles, 4 of high bits (the file's own)
MXFP4_BITS = 4.5  # per 32 weights: the E8M0 scale as an fp16, 16 bytes of 4-bit codes (the file's 4.25 + a byte)
GGUF_Q8_EXACT = ("Q8_0", "Q5_0")
GGUF_FLOAT_TYPES = ("F32", "F16", "BF16")
GGUF_LAYER_FORMATS = ("gguf", "int4", "int8")  # the formats a GGUF loads straight into as layers, on the CPU kernels


def gguf_layer_format(type_name: str, target: str, head: bool = False) -> str:
    """The block format ("int4" Q4_1 / "q4_k" Q4_K / "q5_0" Q5_0 / "q5_k" Q5_K / "q6_k" Q6_K / "mxfp4" MXFP4 / "int8" Q8_0) a GGUF tensor of `type_name` is stored
    in under quantization.format `target` ("gguf": the file's own bits; "int4" / "int8": pinned; a Q4_K is 4-bit as
    it is).
    A head is Q8_0 (Q6_K where the file's is Q6_K under "gguf"), against x in two int8 parts (int4 heads and heads
    on one int8 rounding of x flip SmolLM2's answers)."""
    if head:
        return "q6_k" if type_name == "Q6_K" and target == "gguf" else "int8"
    if target == "int8":
        return "int8"
    if type_name == "Q4_K":
        return "q4_k"
    if type_name in ("Q5_0", "Q5_K", "Q6_K", "MXFP4") and target == "gguf":
        return type_name.lower()
    if target == "int4":
        return "int4"
    return "int4" if type_name in GGUF_Q4_SOURCES else "int8"
