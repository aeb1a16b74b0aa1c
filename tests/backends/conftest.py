"""Fixtures for backend tests: the resolver's plan for a profile built in a test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def plan_for():
    """profile -> the real resolver's Plan for it on this machine."""
    from inferplug.hardware import probe
    from inferplug.resolver import resolve

    hardware = probe()
    return lambda profile: resolve(profile, hardware)
