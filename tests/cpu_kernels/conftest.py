import pytest

from inferplug import cpu_kernels


@pytest.fixture(scope="session", params=list(cpu_kernels.ISA_FLAGS))
def ops(request):
    """torch.ops.inferplug running one kernel set (avx2, avx512) at a time: every kernel test runs on each."""
    ops = cpu_kernels.ops()
    if ops is None:
        pytest.skip(f"the CPU kernels cannot run here: {cpu_kernels.unavailable_reason() or 'they failed to build'}")
    if request.param not in cpu_kernels.supported_isas():
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    cpu_kernels.set_isa(request.param)
    yield ops
    cpu_kernels.set_isa(cpu_kernels.chosen_isa())
