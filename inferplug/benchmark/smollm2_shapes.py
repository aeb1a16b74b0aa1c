"""SmolLM2-135M's linear layers as the kernel benches step through them (bench/quant_linear.py,
bench/cpu_kernels_isa.py): every layer's matrices with weights of their own, so they stream from DRAM as in decode."""

LAYERS = 30
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in): qkv, o, gate_up, down
HEAD_SHAPE = (49152, 576)
