"""A builder killed mid-build (a server stopped during its first start) must not stall every later start: torch's
lock file (FileBaton) stays behind it, and torch waits on such a file for ever."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from torch.utils.cpp_extension import _get_build_directory

from inferplug.kernels import cpu as cpu_kernels


def test_a_dead_builders_lock_file_does_not_stall_the_next_start(cpu_kernel_ops):
    baton = Path(_get_build_directory(cpu_kernels.EXTENSION, verbose=False)) / "lock"
    baton.touch()  # what a builder killed mid-build leaves
    start = subprocess.run([sys.executable, "-c", "from inferplug.kernels import cpu; assert cpu.ops() is not None"],
                           capture_output=True, text=True, timeout=600)  # the kernels are built: a load, seconds
    assert start.returncode == 0, start.stderr
    assert not baton.exists()
