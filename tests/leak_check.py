"""The leak check of every native engine a test builds (tests/conftest.py runs it after each test): no request left
unfinished and the KV pool whole, on the engines the test built (make_engine's, an LLM's, a backend's) and on every
engine still alive from before (a backend the registry keeps for the session).

Engines are found by a test-only hook on LLMEngine.__init__, and AsyncEngine.__init__: a step thread's engine is
read with its lock held, so never in the middle of a step.
"""

from __future__ import annotations

import functools
import weakref

LOCK_WAIT_S = 10  # a step thread that holds its engine's lock longer than this is hung: the check says so

built: list = []  # this test's engines, held until its check: one the test dropped is checked too
_alive: weakref.WeakSet = weakref.WeakSet()  # every engine not yet collected, built in this test or before
_stepped: weakref.WeakSet = weakref.WeakSet()  # every AsyncEngine not yet collected
_reported: weakref.WeakSet = weakref.WeakSet()  # engines whose leak a check reported: one report, not one a test


def install() -> None:
    """Record every LLMEngine and AsyncEngine from now on (once per session)."""
    from inferplug.backends.async_engine import AsyncEngine
    from inferplug.engine.llm_engine import LLMEngine

    _record_instances(LLMEngine, lambda engine: (built.append(engine), _alive.add(engine)))
    _record_instances(AsyncEngine, _stepped.add)


def _record_instances(cls, record) -> None:
    init = cls.__init__

    @functools.wraps(init)
    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        record(self)

    cls.__init__ = recorded


def check_engines() -> None:
    """Assert the check on this test's engines (the pool's invariants too) and on every live one, then forget this
    test's. An engine a step thread drives is read under that thread's lock."""
    fresh = {id(engine) for engine in built}
    stepped = {id(async_engine.engine): async_engine for async_engine in list(_stepped)}
    try:
        for engine in {id(e): e for e in [*built, *_alive] if e not in _reported}.values():
            _reported.add(engine)  # until it passes below
            async_engine = stepped.get(id(engine))
            if async_engine is None:
                _check(engine, full=id(engine) in fresh)
            else:
                assert async_engine._lock.acquire(timeout=LOCK_WAIT_S), f"the step thread held its lock {LOCK_WAIT_S} s"
                try:
                    assert not async_engine._open, f"requests left unfinished: {sorted(async_engine._open)}"
                    _check(engine, full=id(engine) in fresh)
                finally:
                    async_engine._lock.release()
            _reported.discard(engine)
    finally:
        built.clear()


def _check(engine, full: bool) -> None:
    assert not engine.has_unfinished(), f"requests left unfinished: {sorted(engine.requests)}"
    for pool in engine.kv_pools:  # the target's, and a draft model's
        if full:  # the pool's whole walk on this test's engines: a long-lived one's large pool is not walked every test
            pool.check_invariants()
        for group in [g for g in (pool, pool.window) if g is not None]:  # a window group pins its null block
            leaked = group.num_blocks - group.num_free - (group.null is not None)
            assert not leaked, f"blocks leaked: {leaked} of {group.num_blocks}"
