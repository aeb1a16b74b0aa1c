import pytest

from inferplug import cpu_kernels


@pytest.fixture(scope="session")
def ops():
    ops = cpu_kernels.ops()
    if ops is None:
        pytest.skip(f"the CPU kernels cannot run here: {cpu_kernels.unavailable_reason() or 'they failed to build'}")
    return ops
