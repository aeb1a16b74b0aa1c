"""inferplug.benchmark.machine: the facts every benchmark report records, read from this process and host."""

import mmap
import os

import pytest

from inferplug.benchmark.machine import machine, memory_bytes, version_of


def test_machine_names_the_cores_used_and_the_installed_versions():
    info = machine()
    assert info["cores"] == os.cpu_count() and machine(1)["cores"] == 1
    assert info["versions"]["torch"] == version_of("torch") != "?"
    assert version_of("no-such-package-inferplug") == "?"


def test_memory_bytes_reads_the_peak_and_the_current_resident_size():
    before = memory_bytes("VmHWM", "VmRSS")
    block = mmap.mmap(-1, 64 * 2**20)  # fresh pages from the kernel (a bytearray may reuse resident heap), touched
    for page in range(0, len(block), mmap.PAGESIZE):
        block[page] = 1
    after = memory_bytes("VmHWM", "VmRSS")
    assert after["VmHWM"] >= after["VmRSS"] >= before["VmRSS"] + 60 * 2**20
    with pytest.raises(RuntimeError, match="has no VmNothing"):
        memory_bytes("VmNothing")
