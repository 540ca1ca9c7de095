"""The face's name tables: every built-in env id, and third-party env plugins.

This module (with ``cli.py``) is the only place that names things outside the core.
Entry points are strings, so registering imports nothing heavy: an env's module is
imported by ``gymnasium.make`` on first use.

Third-party packages add envs through the entry-point group ``trace_gym.envs``: each
entry point names either a ``gymnasium.Env`` subclass (registered as
``trace_gym/<entry point name>``) or a zero-argument function that registers its own
ids. See ``docs/adding-an-environment.md``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Mapping

NAMESPACE = "trace_gym"
ENTRY_POINT_GROUP = "trace_gym.envs"

#: Built-in env ids -> entry point ("module:Class"). One explicit table.
BUILTIN_ENVS: dict[str, str] = {
    "GuessNumber-v0": "environments.guess_number.env:GuessNumberEnv",
    "MathPython-v0": "environments.math_python.env:MathPythonEnv",
    "BFCL-v0": "environments.bfcl.env:BFCLEnv",
}

@dataclass(frozen=True)
class EnvFamily:
    """An environment as the benches and the trainer use it: how to make one, how to load tasks.

    Attributes:
        env_id: the registered Gymnasium id (``trace_gym/...``).
        task_loader: ``"module:function"``, called as ``loader(n, seed=seed, **loader_kwargs)``
            and returning ``list[Task]``; imported only when tasks are loaded.
        loader_kwargs: extra keyword arguments of the task loader.
        env_kwargs: keyword arguments of ``gymnasium.make``.
        description: one line for ``trace-gym envs``.
    """

    env_id: str
    task_loader: str
    loader_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def load_tasks(self, n: int, seed: int = 0) -> list:
        """``n`` tasks from the family's loader."""
        import importlib

        module, _, function = self.task_loader.partition(":")
        return getattr(importlib.import_module(module), function)(n, seed=seed, **dict(self.loader_kwargs))

    def make_env(self) -> Any:
        """A fresh env instance (``Callable[[], AgentEnv]``); the id is registered first."""
        import gymnasium

        register_envs()
        return gymnasium.make(self.env_id, disable_env_checker=True, **dict(self.env_kwargs))


#: Env families the benches know by short name. ``math_python`` is the offline CPU
#: default: digit sums (which a 135M model often solves) interleaved with harder
#: generated algebra (which it rarely does), a one-shot demonstration of the tool format
#: (so episodes have several turns), and a last-number fallback (the model rarely
#: writes \boxed{}).
ENV_FAMILIES: dict[str, EnvFamily] = {
    "math_python": EnvFamily("trace_gym/MathPython-v0", "environments.math_python.generated:generate_mixed_tasks",
                             env_kwargs={"answer_extraction": "boxed_or_last_number", "few_shot": True},
                             description="Python-interpreter math, generated digit sums + algebra (CPU default)"),
    "math_python_hard": EnvFamily("trace_gym/MathPython-v0", "environments.math_python.generated:generate_tasks",
                                  loader_kwargs={"difficulty": (0, 1, 2)},
                                  description="Python-interpreter math, generated algebra of difficulty 0-2"),
    "guess_number": EnvFamily("trace_gym/GuessNumber-v0", "environments.guess_number.env:make_tasks",
                              description="the reference env: guess a hidden number with feedback"),
    "bfcl": EnvFamily("trace_gym/BFCL-v0", "environments.bfcl.data:sample_tasks",
                      description="BFCL v4 multi-turn on the real backends"),
}

_log = logging.getLogger(__name__)
_registered = False  # plugins of the entry-point group loaded


def register_envs(*, plugins: bool = True) -> list[str]:
    """Register built-in ids (and plugins) with Gymnasium; idempotent. Returns new ids."""
    global _registered
    import gymnasium
    from gymnasium.envs.registration import registry

    added: list[str] = []
    for name, entry_point in BUILTIN_ENVS.items():
        env_id = f"{NAMESPACE}/{name}"
        if env_id not in registry:
            gymnasium.register(id=env_id, entry_point=entry_point)
            added.append(env_id)
    if plugins and not _registered:
        added.extend(_load_plugins())
        _registered = True  # set only once plugins were actually loaded
    return added


def _load_plugins() -> list[str]:
    import gymnasium
    from gymnasium.envs.registration import registry

    added: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = ep.load()
        except Exception as exc:  # a broken plugin must not break the core; say so loudly
            _log.warning("trace_gym env plugin %r failed to load: %s", ep.value, exc)
            continue
        if isinstance(target, type) and issubclass(target, gymnasium.Env):
            env_id = f"{NAMESPACE}/{ep.name}"
            if env_id not in registry:
                gymnasium.register(id=env_id, entry_point=ep.value)
                added.append(env_id)
        elif callable(target):
            before = set(registry)
            target()
            added.extend(sorted(set(registry) - before))
        else:
            _log.warning("trace_gym env plugin %r is neither an Env class nor a function", ep.value)
    return added


def env_ids() -> list[str]:
    """All ids registered under the ``trace_gym/`` namespace."""
    from gymnasium.envs.registration import registry

    register_envs()
    return sorted(k for k in registry if k.startswith(NAMESPACE + "/"))


def env_family(name: str) -> EnvFamily:
    """The :class:`EnvFamily` registered under the short ``name``."""
    if name not in ENV_FAMILIES:
        raise ValueError(f"unknown env family {name!r}; known: {sorted(ENV_FAMILIES)}")
    return ENV_FAMILIES[name]
