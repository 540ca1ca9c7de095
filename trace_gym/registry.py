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
from importlib.metadata import entry_points
from typing import Callable

NAMESPACE = "trace_gym"
ENTRY_POINT_GROUP = "trace_gym.envs"

#: Built-in env ids -> entry point ("module:Class"). One explicit table.
BUILTIN_ENVS: dict[str, str] = {
    "GuessNumber-v0": "environments.guess_number.env:GuessNumberEnv",
    "MathPython-v0": "environments.math_python.env:MathPythonEnv",
    "BFCL-v0": "environments.bfcl.env:BFCLEnv",
    "WikiQA-v0": "environments.wiki_qa.env:WikiQAEnv",
}

#: Env families the benches know by short name:
#: name -> (gym id, task loader "module:function", loader kwargs, env kwargs).
#: The loader is called as ``loader(n, seed=seed, **loader_kwargs)`` -> ``list[Task]``.
#: ``math_python`` is the offline CPU default: digit sums (which a 135M model often
#: solves) interleaved with harder generated algebra (which it rarely does), a one-shot
#: demonstration of the tool format (so episodes have several turns), and a
#: last-number fallback (the model rarely writes \boxed{}).
ENV_FAMILIES: dict[str, tuple[str, str, dict, dict]] = {
    "math_python": ("trace_gym/MathPython-v0", "environments.math_python.generated:generate_mixed_tasks", {},
                    {"answer_extraction": "boxed_or_last_number", "few_shot": True}),
    "math_python_hard": ("trace_gym/MathPython-v0", "environments.math_python.generated:generate_tasks",
                         {"difficulty": (0, 1, 2)}, {}),
    "guess_number": ("trace_gym/GuessNumber-v0", "environments.guess_number.env:make_tasks", {}, {}),
    "bfcl": ("trace_gym/BFCL-v0", "environments.bfcl.data:sample_tasks", {}, {}),
    "wiki_qa": ("trace_gym/WikiQA-v0", "environments.wiki_qa.data:offline_tasks", {"single_hop_share": 0.5},
                {"few_shot": True}),
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


def env_family(name: str) -> tuple[str, Callable[..., list], dict, dict]:
    """``(gym id, task loader, loader kwargs, env kwargs)`` of a family in :data:`ENV_FAMILIES`."""
    import importlib

    if name not in ENV_FAMILIES:
        raise ValueError(f"unknown env family {name!r}; known: {sorted(ENV_FAMILIES)}")
    env_id, loader, loader_kwargs, env_kwargs = ENV_FAMILIES[name]
    module, _, function = loader.partition(":")
    register_envs()
    return env_id, getattr(importlib.import_module(module), function), dict(loader_kwargs), dict(env_kwargs)
