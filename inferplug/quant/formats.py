"""What the native engine's weight-only formats store (no torch here: the resolver plans with it).

int8 has one bf16 scale per output row (negligible); int4 a bf16 scale and zero per group of 32
inputs, so 4 + 32/32 bits. quantize_model leaves the embedding in the model dtype and gives the lm_head
its own format per device (a copy when tied to the embedding): fp16 on the CPU, which fbgemm reads
faster than int8, and never int4, which flips SmolLM2's confident answers (Paris -> L'Étoile).
"""

LAYER_BITS = {"fp16": 16.0, "int8": 8.0, "int4": 5.0}
HEAD_FORMAT = {"cpu": "fp16", "cuda": "int8"}
