"""[cache] schedule from the profile down: the native backend's scheduler orders its waiting requests by it."""

from __future__ import annotations

import pytest

from inferplug.engine.cache_aware import CacheAwareOrder


@pytest.mark.parametrize("line, ordered", [("", False), ('schedule = "cache_aware"\n', True)])
def test_the_profile_chooses_the_admission_order(tmp_path, tiny_llama_dir, line, ordered):
    from inferplug.llm import LLM

    path = tmp_path / "schedule.toml"
    path.write_text(f'backend = "native"\ndtype = "float32"\n[model]\npath = "{tiny_llama_dir}"\n[cache]\n'
                    f'memory = "16MiB"\n{line}')
    engine = LLM(str(path)).engine
    assert isinstance(engine.scheduler.order, CacheAwareOrder) is ordered
    assert engine.stats()["admitted_out_of_order"] == 0
