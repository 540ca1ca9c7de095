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

NAMESPACE = "trace_gym"
ENTRY_POINT_GROUP = "trace_gym.envs"

#: Built-in env ids -> entry point ("module:Class"). One explicit table.
BUILTIN_ENVS: dict[str, str] = {
    "GuessNumber-v0": "environments.guess_number.env:GuessNumberEnv",
    "MathPython-v0": "environments.math_python.env:MathPythonEnv",
    "BFCL-v0": "environments.bfcl.env:BFCLEnv",
}

_log = logging.getLogger(__name__)
_registered = False


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
    _registered = True
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
