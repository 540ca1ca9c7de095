"""The env family type: how the benches, the trainer and the evaluator make an env and load its tasks.

:class:`EnvFamily` is what :func:`trace_gym.registry.resolve_env` returns for any name a
command takes (a family short name, a registered id, another ecosystem's env), and what an
ecosystem adapter (``environments/ecosystems/``) builds with :func:`adapter_family`. Making an
env registers its id first where the family carries an entry point; what else it needs first
(the built-in ids, the plugins) the face supplies as ``prepare`` when it resolves a name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trace_gym.utils.targets import load_target

#: The Gymnasium namespace of trace_gym's ids (``trace_gym/MathPython-v0``).
NAMESPACE = "trace_gym"


@dataclass(frozen=True)
class EnvFamily:
    """An environment as the benches and the trainer use it: how to make one, how to load tasks.

    Attributes:
        env_id: the registered Gymnasium id (``trace_gym/...``).
        task_loader: ``"module:function"`` (imported only when tasks are loaded) or a
            callable, called as ``loader(n, seed=seed, **loader_kwargs)`` and returning
            ``list[Task]``.
        loader_kwargs: extra keyword arguments of the task loader.
        env_kwargs: keyword arguments of ``gymnasium.make``.
        description: one line for ``trace-gym envs``.
        entry_point: ``"module:Class"`` to register ``env_id`` with where a process has
            not (ids made on the fly, such as the ecosystem adapters' ``gem:<id>``).
        plugins: the ``--plugin`` modules the face resolved the family with
            (:data:`trace_gym.registry.PLUGIN_MODULES`), imported before an env is made, so a
            fresh process the family is pickled into (the conformance kit's cross-process
            check, an env worker) registers what this one did.
        prepare: what :meth:`make_env` runs first, in whatever process it runs in
            (:func:`trace_gym.registry.prepare_family`: the built-in ids, the installed
            plugins, then ``plugins``); ``None``: nothing.
    """

    env_id: str
    task_loader: str | Callable[..., list]
    loader_kwargs: Mapping[str, Any] = field(default_factory=dict)
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""
    entry_point: str | None = None
    plugins: tuple[str, ...] = ()
    prepare: Callable[[EnvFamily], None] | None = field(default=None, compare=False, repr=False)

    def load_tasks(self, n: int, seed: int = 0) -> list:
        """``n`` tasks from the family's loader."""
        loader = load_target(self.task_loader) if isinstance(self.task_loader, str) else self.task_loader
        tasks = list(loader(n, seed=seed, **dict(self.loader_kwargs)))
        if not tasks:
            raise ValueError(f"the task loader of {self.env_id} returned no tasks for n={n}, seed={seed}")
        return tasks

    def make_env(self) -> Any:
        """A fresh env instance (``Callable[[], AgentEnv]``); the id is registered first."""
        import gymnasium
        from gymnasium.envs.registration import registry

        if self.prepare is not None:
            self.prepare(self)
        if self.entry_point is not None and self.env_id not in registry:
            gymnasium.register(id=self.env_id, entry_point=self.entry_point)
        return gymnasium.make(self.env_id, disable_env_checker=True, **dict(self.env_kwargs))


def adapter_env_id(prefix: str, name: str) -> str:
    """The Gymnasium id an ecosystem env is registered under: ``gem:game:X-v0`` is
    ``trace_gym/gem.game.X-v0`` (``gymnasium.make`` reads ``:`` as ``module:id``; other
    characters an id cannot hold become ``_``)."""
    safe = re.sub(r"[^\w.-]", "_", name.replace(":", "."))
    return f"{NAMESPACE}/{prefix}.{safe}"


def adapter_family(prefix: str, name: str, entry_point: str, *, env_kwargs: Mapping[str, Any],
                   task_loader: str | Callable[..., list], loader_kwargs: Mapping[str, Any] | None = None,
                   description: str = "") -> EnvFamily:
    """What an ecosystem adapter's ``family`` returns: ``<prefix>:<name>`` registered as
    :func:`adapter_env_id` with ``entry_point`` (the adapter class), made with
    ``env_kwargs``; ``task_loader`` (a ``"module:function"`` or a picklable callable, it
    travels to workers) is called as ``task_loader(n, seed=seed, **loader_kwargs)``."""
    import gymnasium
    from gymnasium.envs.registration import registry

    env_id = adapter_env_id(prefix, name)
    if env_id not in registry:
        gymnasium.register(id=env_id, entry_point=entry_point)
    return EnvFamily(env_id, task_loader, dict(loader_kwargs or {}), dict(env_kwargs), description, entry_point)
