"""The adapter modules' interface is a Protocol (``trace_gym.registry.EcosystemModule``) and
the adapters are ``ForeignEnv`` s around ``ForeignEpisode`` drivers: every module of
``ECOSYSTEMS`` has what the face reads, and a module or driver that lacks a member is
refused in one line naming it."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from foreign_envs import HotColdEpisode
from trace_gym import registry
from trace_gym.env.adapter import CopyState, ForeignEnv, ForeignEpisode, episode_problems
from trace_gym.registry import ECOSYSTEMS, EcosystemModule, module_problems
from trace_gym.utils.targets import load_target


@pytest.mark.parametrize("prefix", sorted(ECOSYSTEMS))
def test_every_ecosystem_module_is_an_ecosystem_module_and_names_a_foreign_env(prefix):
    module = registry.ecosystem_module(prefix)
    assert isinstance(module, EcosystemModule) and module_problems(module) == []
    assert module.PREFIX == prefix and module.PACKAGE
    env_class = load_target(module.ENTRY_POINT)
    assert isinstance(env_class, type) and issubclass(env_class, ForeignEnv)


def test_a_module_without_family_is_refused_naming_it(monkeypatch):
    planted = types.ModuleType("planted_ecosystem")
    planted.PACKAGE, planted.PREFIX, planted.ENTRY_POINT = "planted", "planted", "planted_ecosystem:Env"
    planted.available = lambda: []
    monkeypatch.setitem(sys.modules, "planted_ecosystem", planted)
    monkeypatch.setitem(ECOSYSTEMS, "planted", "planted_ecosystem")
    assert not isinstance(planted, EcosystemModule) and module_problems(planted) == ["family"]
    with pytest.raises(TypeError, match=r"planted_ecosystem .*not an EcosystemModule: it lacks family$"):
        registry.resolve_env("planted:anything")
    planted.family = lambda name, options, env_kwargs, task_kwargs: (name, options)
    assert isinstance(planted, EcosystemModule)
    assert registry.resolve_env("planted:x?a=1") == ("x", {"a": 1})


def test_a_driver_that_lacks_a_member_is_refused_naming_it():
    class NoAct(HotColdEpisode):
        act = None

    class CopyWithoutState:
        snapshot_strategies, global_rng, env_key = ("copy",), False, "k"
        begin = act = end = default_tasks = load_task = staticmethod(lambda *a: None)

    assert isinstance(HotColdEpisode(), ForeignEpisode) and isinstance(HotColdEpisode(), CopyState)
    assert episode_problems(HotColdEpisode()) == []
    with pytest.raises(TypeError, match=r"NoAct is not a ForeignEpisode: it lacks act$"):
        ForeignEnv(NoAct())
    assert episode_problems(CopyWithoutState()) == ["state (for 'copy')", "set_state (for 'copy')"]
    with pytest.raises(TypeError, match=r"lacks state \(for 'copy'\), set_state \(for 'copy'\)"):
        ForeignEnv(CopyWithoutState())


def test_the_old_base_class_names_the_migration():
    with pytest.raises(ImportError, match=r"AdaptedEnv is gone.*ForeignEnv\(driver"):
        from trace_gym.env.adapter import AdaptedEnv  # noqa: F401
    assert importlib.import_module("trace_gym.env.adapter").ForeignEnv is ForeignEnv
