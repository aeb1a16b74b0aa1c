"""One shared backend per profile per process, built through resolve() and the entry points."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from inferplug.backends import registry
from inferplug.hardware import Hardware
from inferplug.profile import load_profile

CPU = Hardware(cpu_flags=frozenset({"avx2"}), cpu_count=2, ram_total=8 << 30, ram_available=4 << 30,
               packages=frozenset({"torch", "transformers"}))


@pytest.fixture
def tiny_profile(tiny_llama_dir, tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n'
                    '[cache]\nmemory = "8MiB"\n')
    yield path
    for backend in registry.loaded_backends():  # close only this test's backends: others may share the registry
        if backend.profile.source_file == path.resolve():
            registry.close_backend(backend.profile)


def test_same_profile_shares_one_backend_across_threads(tiny_profile):
    with ThreadPoolExecutor(4) as pool:
        backends = list(pool.map(lambda _: registry.get_backend(tiny_profile, CPU), range(4)))
    first = backends[0]
    assert all(b is first for b in backends)
    assert first.name == "native" and first.plan.device == "cpu" and first.plan.dtype == "float32"
    assert registry.get_backend(load_profile(tiny_profile), CPU) is first  # a Profile object works too
    assert [b for b in registry.loaded_backends() if b is first] == [first]


def test_changed_profile_gets_its_own_backend_and_close_forgets_it(tiny_profile):
    first = registry.get_backend(tiny_profile, CPU)
    other = load_profile(tiny_profile)
    other.cache.block_size = 32
    second = registry.get_backend(other, CPU)
    assert second is not first and second.plan.block_size == 32
    registry.close_backend(tiny_profile)
    loaded = registry.loaded_backends()
    assert first not in loaded and second in loaded
    assert registry.get_backend(tiny_profile, CPU) is not first
