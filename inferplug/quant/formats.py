"""What the native engine's weight-only formats store (no torch here: the resolver plans with it).

int8 and int4 are GGUF's Q8_0 and Q4_1 blocks on inferplug's CPU kernels: an fp16 scale (and for Q4_1
an fp16 min) per 32 inputs, so 8.5 and 5 bits. On CUDA, int8 keeps one scale per row (8 bits; the plan
counts 8.5, a little high). quantize_model leaves the embedding in the model dtype and gives the lm_head
its own format (a copy when tied to the embedding), `head_format`. On the CPU an int8 head keeps the
activations float, so the logits stay float-accurate (under int4 layers, a Q8_0 head on int8 activations
flipped SmolLM2's "Paris" to "L'Étoile", as an int4 head does).
"""

LAYER_BITS = {"fp16": 16.0, "int8": 8.5, "int4": 5.0}
# AWQ / GPTQ int4 checkpoints load as layers (quant/checkpoint_layers.py): repacked into Q4_1 blocks where the CPU
# kernels run (5 bits), else kept in groups: 4 bits + an fp16 scale and a uint8 zero per group (4.19 at group 128).
CHECKPOINT_FORMATS = ("awq", "gptq")


def checkpoint_layer_bits(q4_blocks: bool, group_size: int = 128) -> float:
    return LAYER_BITS["int4"] if q4_blocks else 4 + 24 / group_size


def float_model_format(fmt: str) -> str:
    """The format a float model (a draft beside the target) is quantized to alike: `fmt`, but int4 beside an AWQ /
    GPTQ checkpoint, whose format only loads packed layers (its CPU layers are the same Q4_1 blocks)."""
    return "int4" if fmt in CHECKPOINT_FORMATS else fmt


def head_format(layer_format: str, device_kind: str) -> str:
    """The lm_head's format under `layer_format` layers: int8, but fp16 under fp16 layers on the CPU, whose
    greedy output must match fp32 (quantize_model still gives a GGUF's Q8_0 head Q8_0 blocks there: lossless)."""
    return "fp16" if device_kind == "cpu" and layer_format == "fp16" else "int8"
