"""Fixtures the core tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_work(monkeypatch):
    """Tripwires for a refusal that must come before the work: loading a model, building an
    engine, starting a bench's run or reading a bank's statistics fails the test."""
    import trace_gym.banks
    import trace_gym.engines
    import trace_gym.models
    from trace_gym.commands import bench

    def tripped(*args, **kwargs):
        raise AssertionError("the work started before the bad input was refused")

    monkeypatch.setattr(trace_gym.engines, "make_engine", tripped)
    monkeypatch.setattr(trace_gym.models, "resolve_model", tripped)
    monkeypatch.setattr(trace_gym.banks, "bank_stats", tripped)
    monkeypatch.setattr(bench, "mode_runner", lambda *args, **kwargs: tripped)
