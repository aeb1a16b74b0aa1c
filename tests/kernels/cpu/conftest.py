import pytest

from inferplug.kernels import cpu as cpu_kernels


@pytest.fixture(scope="session", params=list(cpu_kernels.KERNEL_SETS))
def ops(request, cpu_kernel_ops):
    """torch.ops.inferplug running one kernel set (avx2, avx512) at a time: every kernel test runs on each.
    cpu_kernel_ops skips without AVX2/FMA/F16C and fails with the compiler's error if the kernels do not build."""
    if request.param not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    cpu_kernels.set_isa(request.param)
    yield cpu_kernel_ops
    cpu_kernels.set_isa(cpu_kernels.chosen_isa())
