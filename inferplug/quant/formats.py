"""What the native engine's weight-only formats store (no torch here: the resolver plans with it).

int8 and int4 are GGUF's Q8_0 and Q4_1 blocks on inferplug's CPU kernels: an fp16 scale (and for Q4_1
an fp16 min) per 32 inputs, so 8.5 and 5 bits. On CUDA, int8 keeps one scale per row (8 bits; the plan
counts 8.5, a little high). quantize_model leaves the embedding in the model dtype and gives the lm_head
its own format per device (a copy when tied to the embedding): fp16 on the CPU, which keeps the logits
float-accurate (under int4 layers, a Q8_0 head on int8 activations flipped SmolLM2's "Paris" to
"L'Étoile", as an int4 head does).
"""

LAYER_BITS = {"fp16": 16.0, "int8": 8.5, "int4": 5.0}
HEAD_FORMAT = {"cpu": "fp16", "cuda": "int8"}
