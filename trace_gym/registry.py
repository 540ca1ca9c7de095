"""The face's name tables: built-in env ids, env families, and plugins.

This module (with ``cli.py`` and ``strategies.py``) is the only place that names things
outside the core. Entry points are strings, so registering imports nothing heavy: an
env's module is imported by ``gymnasium.make`` on first use.

Plugins (see ``docs/adding-an-environment.md`` and ``docs/strategies.md``) arrive one way,
:func:`load_plugins`, from these sources:

- the entry-point group ``trace_gym.envs``: a name shaped like an env id
  (``ArithChain-v0``) names a ``gymnasium.Env`` class, registered as
  ``trace_gym/<name>`` by string *at* ``import trace_gym`` (nothing of the plugin is
  imported until the env is made); any other name names a zero-argument function that
  registers its own ids, called when plugins load;
- the group ``trace_gym.tasks``: ``<env id or name> = "pkg.module:load_tasks"``, a task
  loader ``load_tasks(n, seed=0, **kwargs) -> list[Task]`` (an env class may instead
  carry a ``load_tasks`` classmethod);
- the group ``trace_gym.strategies``: ``<name> = "pkg.module:OBJECT"``, a ``Strategy``, or
  a zero-argument function returning one or a ``{name: Strategy}`` dict;
- the group ``trace_gym.train.advantages``: ``<name> = "pkg.module:function"``, an advantage
  estimator ``fn(tree, *, eps, std_normalize) -> {node id: advantage}``;
- ``--plugin MODULE`` (config key ``plugins``): a module that is not installed (the
  current folder is on the import path, as with ``python -m``); importing it runs its own
  registration calls (``trace_gym.api.register_env`` / ``register_strategy``).

An installed plugin that fails to load is reported in one line naming it, and the
built-ins still work; a ``--plugin`` module that fails to import stops the command with
one line naming the module and the file and line that raised (the command asked for it).
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import dataclasses
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from trace_gym.env.family import NAMESPACE, EnvFamily
from trace_gym.utils.targets import load_target

ENTRY_POINT_GROUP = "trace_gym.envs"
TASKS_GROUP = "trace_gym.tasks"
STRATEGIES_GROUP = "trace_gym.strategies"
#: an entry-point name of this shape names an Env class (registered lazily by string)
ENV_ID_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*-v\d+$")

#: Built-in env ids -> entry point ("module:Class"). One explicit table.
BUILTIN_ENVS: dict[str, str] = {
    "GuessNumber-v0": "environments.guess_number.env:GuessNumberEnv",
    "MathPython-v0": "environments.math_python.env:MathPythonEnv",
    "BFCL-v0": "environments.bfcl.env:BFCLEnv",
    "WikiQA-v0": "environments.wiki_qa.env:WikiQAEnv",
}

def prepare_family(family: EnvFamily) -> None:
    """What making a resolved family's env needs first, in any process it was pickled into
    (:attr:`EnvFamily.prepare`): the built-in ids and the installed plugins
    (:func:`register_envs`), then the family's ``--plugin`` modules."""
    register_envs()
    if family.plugins:
        load_plugins(family.plugins)


def _family(env_id: str, task_loader: str | Callable[..., list], *args: Any, **kwargs: Any) -> EnvFamily:
    """An :class:`EnvFamily` the face resolved: its env made after :func:`prepare_family`."""
    return EnvFamily(env_id, task_loader, *args, prepare=prepare_family, **kwargs)


#: Env families the benches know by short name. ``math_python`` is the offline CPU
#: default: digit sums (which a 135M model often solves) interleaved with harder
#: generated algebra (which it rarely does), a one-shot demonstration of the tool format
#: (so episodes have several turns), and a last-number fallback (the model rarely
#: writes \boxed{}).
ENV_FAMILIES: dict[str, EnvFamily] = {
    "math_python": _family("trace_gym/MathPython-v0", "environments.math_python.generated:generate_mixed_tasks",
                          env_kwargs={"answer_extraction": "boxed_or_last_number", "few_shot": True},
                          description="Python-interpreter math, generated digit sums + algebra (CPU default)"),
    "math_python_hard": _family("trace_gym/MathPython-v0", "environments.math_python.generated:generate_tasks",
                               loader_kwargs={"difficulty": (0, 1, 2)},
                               description="Python-interpreter math, generated algebra of difficulty 0-2"),
    "guess_number": _family("trace_gym/GuessNumber-v0", "environments.guess_number.env:make_tasks",
                           description="the reference env: guess a hidden number with feedback"),
    "bfcl": _family("trace_gym/BFCL-v0", "environments.bfcl.data:sample_tasks",
                   description="BFCL v4 multi-turn on the real backends"),
    "wiki_qa": _family("trace_gym/WikiQA-v0", "environments.wiki_qa.data:offline_tasks",
                      loader_kwargs={"single_hop_share": 0.5}, env_kwargs={"few_shot": True},
                      description="multi-hop QA over the synthetic offline Wikipedia-style corpus (retrieval)"),
}



@runtime_checkable
class EcosystemModule(Protocol):
    """What an adapter module of :data:`ECOSYSTEMS` offers the face (``environments/ecosystems/gem.py``
    and its siblings; docs/ecosystem.md). A module, not a class: :func:`ecosystem_module`
    checks it with :func:`module_problems` when it imports it.

    Attributes:
        PACKAGE: the distribution it wraps (named when it is missing or lists nothing).
        PREFIX: the id prefix it serves (its key in :data:`ECOSYSTEMS`).
        ENTRY_POINT: ``"module:Class"`` of its env (a :class:`~trace_gym.env.adapter.ForeignEnv`).
    """

    PACKAGE: str
    PREFIX: str
    ENTRY_POINT: str

    def family(self, name: str, options: dict, env_kwargs: dict, task_kwargs: dict) -> EnvFamily:
        """The :class:`EnvFamily` of ``<PREFIX>:<name>`` (``options`` from an ``?a=1&b=x``
        tail); one-line ``ValueError`` s for what it does not take (:func:`adapter_family`
        builds the answer)."""

    def available(self) -> list[str]:
        """The ids (``<PREFIX>:...``) the installed package provides; may be empty."""


def module_problems(module: Any) -> list[str]:
    """The :class:`EcosystemModule` members ``module`` lacks (``[]``: none)."""
    missing = [name for name in ("PACKAGE", "PREFIX", "ENTRY_POINT") if not isinstance(getattr(module, name, None), str)]
    return missing + [name for name in ("family", "available") if not callable(getattr(module, name, None))]


#: Other ecosystems' envs, by id prefix (``--env gem:game:GuessTheNumber-v0-easy``): the
#: :class:`EcosystemModule` of each, in ``environments/ecosystems`` (imported only when an
#: id with its prefix is named).
ECOSYSTEMS: dict[str, str] = {
    "gem": "environments.ecosystems.gem",
    "skyrl": "environments.ecosystems.skyrl",
    "verifiers": "environments.ecosystems.verifiers",
    "openenv": "environments.ecosystems.openenv",
    "reasoning_gym": "environments.ecosystems.reasoning_gym",
}

_log = logging.getLogger(__name__)
_plugins_loaded = False
#: task loaders registered in code (``trace_gym.api.register_env``): env id -> loader
TASK_LOADERS: dict[str, str | Callable[..., list]] = {}
#: what the last :func:`load_plugins` found: source -> error, for plugins that failed
PLUGIN_ERRORS: dict[str, str] = {}
#: the ``--plugin`` modules imported in this process, in order (a resolved
#: :class:`EnvFamily` carries them to the processes it is pickled into)
PLUGIN_MODULES: list[str] = []


def register_envs(*, plugins: bool = True) -> list[str]:
    """Register built-in ids and the id-named env plugins (by string, nothing imported);
    with ``plugins`` also run every other plugin (:func:`load_plugins`). Idempotent.
    Returns the ids added by this call."""
    import gymnasium
    from gymnasium.envs.registration import registry

    added: list[str] = []
    lazy = {f"{NAMESPACE}/{name}": ep for name, ep in BUILTIN_ENVS.items()}
    lazy |= {f"{NAMESPACE}/{ep.name}": ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)
             if ENV_ID_NAME.match(ep.name)}
    for env_id, entry_point in lazy.items():
        if env_id not in registry:
            gymnasium.register(id=env_id, entry_point=entry_point)
            added.append(env_id)
    if plugins:
        added += load_plugins()
    return added


def _report(source: str, exc: BaseException) -> None:
    PLUGIN_ERRORS[source] = f"{type(exc).__name__}: {exc}"
    _log.warning("trace_gym plugin %s failed to load (%s: %s); the built-ins still work", source,
                 type(exc).__name__, exc)


def load_plugins(modules: Sequence[str] = ()) -> list[str]:
    """Load every plugin once: registration functions of ``trace_gym.envs``, strategies of
    ``trace_gym.strategies``, estimators of ``trace_gym.train.advantages``, and the given modules (``--plugin``; imported every call
    that names them, which is a no-op after the first).

    Returns the env ids the plugins added. Failures of installed plugins are logged in one
    line each and kept in :data:`PLUGIN_ERRORS`; they never stop the built-ins.

    Raises:
        ValueError: a module of ``modules`` failed to import (one line: the module, the
            exception, and the file and line that raised it).
    """
    global _plugins_loaded
    from gymnasium.envs.registration import registry

    before = set(registry)
    if not _plugins_loaded:
        _plugins_loaded = True
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            if ENV_ID_NAME.match(ep.name):
                continue  # registered by string in register_envs
            try:
                target = ep.load()
                if not callable(target):
                    raise TypeError(f"{ep.value} is not a registration function")
                target()
            except Exception as exc:  # a broken plugin must not break the core; say so
                _report(f"{ENTRY_POINT_GROUP}:{ep.name} ({ep.value})", exc)
        from trace_gym.strategies import register_strategy

        for ep in entry_points(group=STRATEGIES_GROUP):
            try:
                target = ep.load()
                made = target() if callable(target) and not hasattr(target, "root_allocator") else target
                for name, strategy in (made.items() if isinstance(made, Mapping) else [(ep.name, made)]):
                    register_strategy(name, strategy)
            except Exception as exc:
                _report(f"{STRATEGIES_GROUP}:{ep.name} ({ep.value})", exc)
        from trace_gym.train.advantages import ENTRY_POINT_GROUP as ESTIMATORS_GROUP, register_estimator

        for ep in entry_points(group=ESTIMATORS_GROUP):
            try:
                register_estimator(ep.name, ep.load())
            except Exception as exc:
                _report(f"{ESTIMATORS_GROUP}:{ep.name} ({ep.value})", exc)
    if modules:
        _cwd_on_path()
    for module in modules:
        import_plugin(module)
        if module not in PLUGIN_MODULES:
            PLUGIN_MODULES.append(module)
    return sorted(set(registry) - before)


#: Seconds a ``--plugin`` module may take to import.
PLUGIN_IMPORT_TIMEOUT_S = 120.0


def import_plugin(module: str) -> None:
    """Import a ``--plugin`` module through the boundary of foreign code
    (:class:`~trace_gym.env.boundary.ForeignBoundary`): within :data:`PLUGIN_IMPORT_TIMEOUT_S`,
    every exception and exit (``sys.exit(0)`` included) caught, process state put back.

    Raises:
        ValueError: one line naming the module and what happened (the file and line that raised).
    """
    from trace_gym.env.boundary import ForeignBoundary, ForeignEnvError

    if module in sys.modules:
        return
    boundary = ForeignBoundary(call_timeout_s=PLUGIN_IMPORT_TIMEOUT_S, subject=f"plugin {module!r}")
    try:
        boundary.call("import", importlib.import_module, module, where=f"--plugin {module}")
    except ForeignEnvError as exc:  # a hang, an exit, another BaseException
        raise ValueError(str(exc)) from None
    except Exception as exc:  # asked for by name: the command cannot go on without it
        raise ValueError(f"--plugin {module} failed: {_raised_where(exc)}") from None


def _cwd_on_path() -> None:
    """The current folder first on ``sys.path``, as ``python -m`` has it, so ``--plugin
    MODULE`` finds a module beside the user without ``PYTHONPATH`` (the ``trace-gym``
    script's own ``sys.path[0]`` is its bin folder)."""
    import os
    import sys

    cwd = os.getcwd()
    if not any(os.path.realpath(p or os.curdir) == os.path.realpath(cwd) for p in sys.path):
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()


def _raised_where(exc: BaseException) -> str:
    """``"ZeroDivisionError at my_envs.py:12: division by zero"``: the exception and the
    innermost frame that raised it (a path under the current folder is shown relative)."""
    import os
    import traceback

    if isinstance(exc, SyntaxError) and exc.filename:
        file, line = exc.filename, exc.lineno
    else:
        from trace_gym.env import boundary as env_boundary

        machinery = {os.path.realpath(importlib.__file__), os.path.realpath(__file__),
                     os.path.realpath(env_boundary.__file__)}  # the boundary the import ran in
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith("<frozen") and os.path.realpath(f.filename) not in machinery]
        file, line = (frames[-1].filename, frames[-1].lineno) if frames else (None, None)
    if file is None:  # nothing of the plugin ran: it was not found
        hint = " (not importable from the current folder or sys.path)" if isinstance(exc, ModuleNotFoundError) else ""
        return f"{type(exc).__name__}: {exc}{hint}"
    if not os.path.relpath(file).startswith(os.pardir):
        file = os.path.relpath(file)
    message = exc.msg if isinstance(exc, SyntaxError) else exc
    return f"{type(exc).__name__} at {file}:{line}: {message}"


def env_ids() -> list[str]:
    """All ids registered under the ``trace_gym/`` namespace (plugins loaded)."""
    from gymnasium.envs.registration import registry

    register_envs()
    return sorted(k for k in registry if k.startswith(NAMESPACE + "/"))


def _task_loader_for(env_id: str) -> Callable[..., list] | str:
    """An env's task loader: one registered in code (:data:`TASK_LOADERS`), else a
    ``trace_gym.tasks`` entry point named by its id (or short name), else a
    ``load_tasks`` classmethod on its env class."""
    from gymnasium.envs.registration import registry

    if env_id in TASK_LOADERS:
        return TASK_LOADERS[env_id]
    short = env_id.split("/", 1)[-1]
    for ep in entry_points(group=TASKS_GROUP):
        if ep.name in (env_id, short):
            return ep.value
    spec = registry[env_id]
    cls = spec.entry_point if callable(spec.entry_point) else load_target(spec.entry_point)
    loader = getattr(cls, "load_tasks", None)
    if loader is None:
        raise ValueError(f"env {env_id} declares no task loader: give its class a classmethod "
                         f"load_tasks(n, seed=0, **kwargs) -> list[Task], or add a '{TASKS_GROUP}' entry point "
                         f"named {short!r}")
    return loader


def check_family_kwargs(family: EnvFamily, env_kwargs: Mapping[str, Any], task_kwargs: Mapping[str, Any],
                        keys: tuple[str, str] = ("env_kwargs", "task_kwargs")) -> EnvFamily:
    """``family`` once the user's env and task-loader keyword arguments (``keys`` name them in
    the error) fit the env's constructor and its task loader (names and plain types:
    :func:`trace_gym.utils.signatures.kwargs_problem`), before any env is made or task loaded.

    Raises:
        ValueError: one line naming the key, the callee and the bad keyword.
    """
    from gymnasium.envs.registration import load_env_creator, registry

    from trace_gym.utils.signatures import kwargs_problem

    checks = []
    if env_kwargs:
        register_envs(plugins=False)  # the built-in ids, by string: nothing imported
    if env_kwargs and family.env_id in registry:
        entry = registry[family.env_id].entry_point
        checks.append((keys[0], lambda: entry if callable(entry) else load_env_creator(entry), family.env_kwargs, ()))
    if task_kwargs:
        loader = family.task_loader
        checks.append((keys[1], lambda: load_target(loader) if isinstance(loader, str) else loader,
                       family.loader_kwargs, ("n", "seed")))
    for key, callee, kwargs, supplied in checks:
        try:
            target = callee()
        except Exception:  # noqa: BLE001  (an entry point that does not import: making the env names that)
            continue
        problem = kwargs_problem(target, kwargs, supplied=supplied)
        if problem is not None:
            raise ValueError(f"{key}: {getattr(target, '__qualname__', family.env_id)} {problem}")
    return family


def resolve_env(name: str, env_kwargs: Mapping[str, Any] | None = None,
                task_kwargs: Mapping[str, Any] | None = None, *,
                keys: tuple[str, str] = ("env_kwargs", "task_kwargs")) -> EnvFamily:
    """The env a command names: a family short name (:data:`ENV_FAMILIES`), any
    registered id (``trace_gym/ArithChain-v0``, ``ArithChain-v0``, ``my_ns/Env-v1``), or
    another ecosystem's env by prefix (:data:`ECOSYSTEMS`: ``gem:<id>``,
    ``reasoning_gym:<dataset>?size=50``), with extra env and task-loader keyword
    arguments on top, checked against the env's constructor and task loader
    (:func:`check_family_kwargs`; ``keys`` name them in its errors)."""
    from gymnasium.envs.registration import registry

    env_kwargs, task_kwargs = dict(env_kwargs or {}), dict(task_kwargs or {})
    prefix, sep, rest = name.partition(":")
    if sep and prefix in ECOSYSTEMS:
        return ecosystem_family(prefix, rest, env_kwargs, task_kwargs)
    if name in ENV_FAMILIES:
        fam = ENV_FAMILIES[name]
        return check_family_kwargs(_family(fam.env_id, fam.task_loader, {**fam.loader_kwargs, **task_kwargs},
                                           {**fam.env_kwargs, **env_kwargs}, fam.description),
                                   env_kwargs, task_kwargs, keys)
    register_envs()
    env_id = name if name in registry else f"{NAMESPACE}/{name}"
    if env_id not in registry:
        from trace_gym.utils.suggest import did_you_mean

        ids = sorted(k for k in registry if k.startswith(NAMESPACE + "/"))
        # compared without the shared namespace, which would make every id look close
        short = name.removeprefix(NAMESPACE + "/")
        near = did_you_mean(short, [*ENV_FAMILIES, *(i.split("/", 1)[1] for i in ids)])
        raise ValueError(f"unknown env {name!r}: not an env family ({sorted(ENV_FAMILIES)}) nor a registered id "
                         f"({ids}){near}; plugins load from installed entry points or --plugin MODULE")
    return check_family_kwargs(_family(env_id, _task_loader_for(env_id), task_kwargs, env_kwargs,
                                       plugins=tuple(PLUGIN_MODULES)), env_kwargs, task_kwargs, keys)


def ecosystem_module(prefix: str) -> EcosystemModule:
    """The adapter module of an ecosystem prefix; one line naming the package to install
    when that package is missing.

    Raises:
        ValueError: its package is not installed.
        TypeError: the module is not an :class:`EcosystemModule` (naming what it lacks).
    """
    try:
        module = importlib.import_module(ECOSYSTEMS[prefix])
    except ImportError as exc:
        raise ValueError(f"--env {prefix}:...: the adapter cannot import its package ({exc}); "
                         "`make install` installs every ecosystem package") from None
    missing = module_problems(module)
    if missing:
        raise TypeError(f"{ECOSYSTEMS[prefix]} (ecosystem {prefix!r}) is not an EcosystemModule: it lacks "
                        f"{', '.join(missing)}")
    return module


def ecosystem_family(prefix: str, rest: str, env_kwargs: Mapping[str, Any],
                     task_kwargs: Mapping[str, Any]) -> EnvFamily:
    """The :class:`EnvFamily` of ``<prefix>:<rest>`` (``rest`` may end in ``?k=v&...``)."""
    from trace_gym.env.adapter import query_kwargs

    name, _, query = rest.partition("?")
    if not name:
        raise ValueError(f"--env {prefix}: names no env; `trace-gym envs` lists what {prefix} provides")
    _cwd_on_path()  # `verifiers:MODULE` finds MODULE.py beside the user, as `--plugin MODULE` does
    family = ecosystem_module(prefix).family(name, query_kwargs(query), dict(env_kwargs), dict(task_kwargs))
    # the adapter builds its family below the face; making its env in a fresh process still
    # registers the built-in ids and installed plugins first, as every family the face resolves does
    return dataclasses.replace(family, prepare=prepare_family) if isinstance(family, EnvFamily) else family


def env_family(name: str) -> EnvFamily:
    """The :class:`EnvFamily` a short family name or an env id names (see :func:`resolve_env`)."""
    return resolve_env(name)
