import pytest


@pytest.fixture(scope="session")
def ops(cpu_kernel_ops):
    return cpu_kernel_ops  # skips without the ISA, fails with the compiler's error if they do not build
