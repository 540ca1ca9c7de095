"""OpenEnv (Meta / Hugging Face, PyPI ``openenv-core``) envs under our contract.

An OpenEnv env is a server (an ``openenv.core.env_server.Environment`` subclass served by
``create_app``) that a client drives over a websocket: ``reset(seed=...)``, ``step(action)``
and ``state`` (episode id and step count only). :class:`OpenEnvAdapter` is that client,
speaking through OpenEnv's own ``GenericEnvClient``.

Ids:

``openenv:<URL>`` (``openenv:http://127.0.0.1:8123``)
    a server that is already running. A URL with its own ``?query`` is not supported
    (the ``?`` starts our options).
``openenv:<name>``
    a server the adapter starts itself, from ``server_cmd`` (``"pkg.server.app:app"``
    runs ``uvicorn`` on it with this interpreter; a list or a command line with a
    ``{port}`` placeholder runs as given, a container command included), or, without
    ``server_cmd``, the app of the installed OpenEnv env package of that name
    (:func:`available`).

## Action Space
``TextAction``: the model's raw text, sent as the env's Action JSON ``{action_field: text}``
(default field ``message``), or as what ``action_parser="module:function"`` returns for the
text (a dict or a pydantic ``Action``). An action the env's Action schema rejects ends the
episode as truncated with ``info["env_error"]`` naming the schema's fields.

## Observation Space
``ChatObservation``: one user message per turn, the observation's ``observation_field``,
else its only string field, else the whole observation as JSON (sorted keys); cleaned and
bounded by the adapter's boundary (``max_observation_chars``,
:class:`~trace_gym.env.boundary.ForeignBoundary`). Each reply is read with bounds before
it is parsed (:data:`~environments.ecosystems.openenv_session.MAX_REPLY_DEPTH`).

## Rewards
The step response's ``reward`` (``None`` is 0.0; anything but a finite number is an error
turn).

## Episode End
Terminated when the server says ``done`` (``true`` or ``false`` only: ``"false"`` or ``1``
is an error turn); truncated after ``max_turns`` steps, and on any failure of the server
(dead, slow beyond ``read_timeout``, an error in the env's ``step``, a reply it cannot
read, no reply within ``call_timeout_s``): that turn carries ``info["env_error"]`` and an
observation the model can read, and only that episode ends. A ``reset`` (or a restore) that
cannot reach the server, or gets a reply it cannot read, raises :class:`~environments.ecosystems.openenv_server.OpenEnvError`, one
line naming the URL: there is no episode yet to end.

## Snapshot
``replay`` only: OpenEnv's ``state`` is metadata, not the world, so a snapshot is the task,
the seed and the actions; ``restore`` resets the same session with that seed and re-sends
the actions, each answer checked against the recorded one
(:class:`~trace_gym.env.adapter.ReplayDivergence` otherwise). The env must draw its
randomness from the reset seed.

## Sessions and server lifetime
Each adapter instance holds one websocket session (its own ``Environment`` instance on the
server), opened at the first ``reset`` and reused by later episodes and restores, so
instances never see each other's episodes. OpenEnv's HTTP ``/reset`` and ``/step`` build a
fresh env per request, so they cannot carry an episode; only the websocket can. A server
started by the adapter belongs to the instance that started it (``sessions_per_server=1``,
the default: ``create_app`` admits one session unless given ``max_concurrent_envs``), or,
with ``sessions_per_server=N``, to up to N instances of this process (reference counted:
the env class must set ``SUPPORTS_CONCURRENT_SESSIONS`` and its app admit N sessions). It
is started on a free loopback port, waited for on ``GET /health`` (``start_timeout``), and
its process group is terminated when its last instance closes, is garbage collected, or
the interpreter exits; with ``keep_servers=True`` it stays up, idle, for the next instance
of this process (the rollout code makes a fresh env per episode and branch, so this spares
a server boot each) until :func:`~environments.ecosystems.openenv_server.stop_servers` or the interpreter exits. A server that
dies is never restarted mid-episode; the next ``reset`` starts a new one (logged as a
warning). A server at a URL is never started or stopped by the adapter, and must admit
one session per live instance.

Where the parts live: this module holds the adapter and what the registry calls
(:func:`family`, :func:`load_tasks`, :func:`available`); the websocket session with its
timeouts and retries is :class:`~environments.ecosystems.openenv_session.OpenEnvSession`,
the text <-> JSON mapping is in :mod:`~environments.ecosystems.openenv_mapping`, and the
server processes are in :mod:`~environments.ecosystems.openenv_server`.

## Timeouts and retries (seconds)
``connect_timeout`` (5.0): opening the websocket and each ``/health`` probe.
``read_timeout`` (60.0): each answer to a reset or step. ``start_timeout`` (60.0): a
started server's boot. ``retries`` (2): extra attempts, 0.25 s, 0.5 s, ... apart, for a
reset that cannot connect (or finds the server at capacity), and for a step whose
connection dropped while the server lives (a new session replays the episode, checked,
then the step is sent). A step is never re-sent on a session that may have run it, and a
read timeout is not retried. ``call_timeout_s`` (default :func:`default_call_timeout`, at
least 300): the boundary's outer deadline on a whole reset or step, retries included.

## Version History
v0: first version, for ``openenv-core`` 0.3.0.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from environments.ecosystems.openenv_mapping import (  # noqa: F401  (load_object: public here too)
    action_payload, load_object, render_observation,
)
from environments.ecosystems.openenv_server import server_command
from environments.ecosystems.openenv_session import OpenEnvSession
from trace_gym.env.adapter import ForeignEnv, options_of
from trace_gym.types import Message, Task

PACKAGE = "openenv-core"
PREFIX = "openenv"
ENTRY_POINT = "environments.ecosystems.openenv:OpenEnvAdapter"
TASK_LOADER = "environments.ecosystems.openenv:load_tasks"
#: keyword arguments of :class:`OpenEnvAdapter` an id may set (``name`` comes from the id)
ENV_OPTIONS = ("server_cmd", "server_env", "sessions_per_server", "keep_servers", "action_field",
               "action_parser", "observation_field", "connect_timeout", "read_timeout", "start_timeout",
               "retries", "max_turns", "snapshot", "call_timeout_s", "max_observation_chars")
#: keyword arguments of :func:`load_tasks` an id may set
TASK_OPTIONS = ("reset_kwargs",)
#: tasks a ``reset()`` without ``options["task"]`` draws from (seeds 0..N-1)
DEFAULT_POOL = 100


# --- the adapter ----------------------------------------------------------------------


class OpenEnvEpisode:
    """Episodes of one OpenEnv env server (a :class:`~trace_gym.env.adapter.ForeignEpisode`):
    a reset with the episode seed and steps on one websocket session, kept across
    episodes and closed with the env; ``replay`` only. Arguments as :class:`OpenEnvAdapter`'s.

    Raises:
        ValueError: a bad option (one line naming it).
    """

    snapshot_strategies = ("replay",)
    global_rng = False

    def __init__(self, name: str, *, server_cmd: str | Sequence[str] | None = None,
                 server_env: Mapping[str, str] | None = None, sessions_per_server: int = 1,
                 keep_servers: bool = False,
                 action_field: str = "message", action_parser: str | None = None,
                 observation_field: str | None = None, connect_timeout: float = 5.0, read_timeout: float = 60.0,
                 start_timeout: float = 60.0, retries: int = 2):
        where = f"openenv:{name}"
        self.name, self.where = name, where
        self.url = name.rstrip("/") if is_url(name) else None
        if self.url is not None and server_cmd is not None:
            raise ValueError(f"{where}: names a running server; server_cmd= is for openenv:<name> ids")
        if self.url is None and server_cmd is None:
            raise ValueError(f"{where}: give server_cmd= (how to start the server), or name a URL")
        if server_cmd is not None:
            server_command(server_cmd, 1)  # a bad command is refused now, not at the first reset
        for key, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout),
                           ("start_timeout", start_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{where}: {key} must be a positive number of seconds, got {value!r}")
        for key, value, low in (("retries", retries, 0), ("sessions_per_server", sessions_per_server, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{where}: {key} must be an int >= {low}, got {value!r}")
        if not isinstance(action_field, str) or not action_field:
            raise ValueError(f"{where}: action_field must be a non-empty str, got {action_field!r}")
        if observation_field is not None and not isinstance(observation_field, str):
            raise ValueError(f"{where}: observation_field must be a str or None, got {observation_field!r}")
        self.server_cmd = server_cmd
        self.server_env = {str(k): str(v) for k, v in (server_env or {}).items()}
        if not isinstance(keep_servers, bool):
            raise ValueError(f"{where}: keep_servers must be true or false, got {keep_servers!r}")
        self.sessions_per_server, self.keep_servers = sessions_per_server, keep_servers
        self.action_field, self.observation_field = action_field, observation_field
        self.parser = None if action_parser is None else load_object(action_parser, "action_parser")
        if self.parser is not None and not callable(self.parser):
            raise ValueError(f"{where}: action_parser={action_parser!r} is not callable")
        self.connect_timeout, self.read_timeout = float(connect_timeout), float(read_timeout)
        self.start_timeout, self.retries = float(start_timeout), retries
        self._session = OpenEnvSession(
            where, self.url, server_cmd=server_cmd, server_env=self.server_env,
            sessions_per_server=sessions_per_server, keep_servers=keep_servers,
            connect_timeout=self.connect_timeout, read_timeout=self.read_timeout,
            start_timeout=self.start_timeout, retries=retries)
        self._pool: list[Task] | None = None

    @property
    def env_key(self) -> str:
        return f"OpenEnvAdapter:{self.name}"  # the env class's name, as snapshots have always recorded it

    @property
    def server_pid(self) -> int | None:
        """The pid of the server this instance started or shares (``None`` for a URL)."""
        return self._session.server_pid

    def default_tasks(self) -> Sequence[Task]:
        if self._pool is None:
            self._pool = load_tasks(DEFAULT_POOL, name=self.name)
        return self._pool

    def load_task(self, task_id: str) -> Task:
        found = re.fullmatch(r".+/seed(\d+)", task_id)
        if found is None:
            raise ValueError(f"{self.where}: task id {task_id!r} is not '<name>/seed<N>'")
        return Task(id=task_id, prompt="", source="openenv", metadata={"seed": int(found.group(1))})

    def begin(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        kwargs = dict(task.metadata.get("reset_kwargs") or {})
        answer = self._session.reset(seed, kwargs)  # a failure leaves no episode: step() asks for a reset
        text = render_observation(answer[0], self.observation_field)
        return [Message("user", text)], {"openenv_url": self._session.base_url()}

    def act(self, action: str):
        payload = action_payload(action, self.action_field, self.parser)
        answer, reconnects = self._session.step(payload)
        observation, reward, done = answer  # done and reward as the server sent them: the boundary checks them
        info = {"env_reconnects": reconnects} if reconnects else {}
        return [Message("user", render_observation(observation, self.observation_field))], reward, done, False, info

    def end(self) -> None:
        """Nothing: the session outlives episodes (a reset starts the next on it)."""

    def close(self) -> None:
        self._session.close()  # its server is let go of also if the instance is collected unclosed


class OpenEnvAdapter(ForeignEnv):
    """An OpenEnv env server as an :class:`~trace_gym.env.contract.AgentEnv` (see the module docstring):
    a :class:`~trace_gym.env.adapter.ForeignEnv` around an :class:`OpenEnvEpisode`.

    Args:
        name: the id after ``openenv:``: a URL of a running server, or a label (the name
            of an installed env package when ``server_cmd`` is not given).
        server_cmd: how to start the server (:func:`server_command`); not with a URL.
        server_env: extra environment variables of a started server.
        sessions_per_server: instances of this process that may share one started server.
        keep_servers: a started server outlives its last instance, for the next one.
        action_field, action_parser: how the model's text becomes the Action JSON
            (:func:`action_payload`; the parser as ``"module:function"``).
        observation_field: the observation field shown to the model (:func:`render_observation`).
        connect_timeout, read_timeout, start_timeout: seconds (module docstring).
        retries: extra attempts after a connection failure (module docstring).
        max_turns: truncate after this many steps.
        snapshot: ``"replay"``, the only strategy.
        call_timeout_s: seconds one reset or step may take, retries included (default:
            :func:`default_call_timeout`, so the inner timeouts speak first).
        max_observation_chars: bound on an observation (characters); see
            :class:`~trace_gym.env.boundary.ForeignBoundary`.
    """

    def __init__(self, name: str, *, server_cmd: str | Sequence[str] | None = None,
                 server_env: Mapping[str, str] | None = None, sessions_per_server: int = 1,
                 keep_servers: bool = False,
                 action_field: str = "message", action_parser: str | None = None,
                 observation_field: str | None = None, connect_timeout: float = 5.0, read_timeout: float = 60.0,
                 start_timeout: float = 60.0, retries: int = 2, max_turns: int | None = None,
                 snapshot: str | None = None, call_timeout_s: float | None = None,
                 max_observation_chars: int | None = None):
        episode = OpenEnvEpisode(name, server_cmd=server_cmd, server_env=server_env,
                                 sessions_per_server=sessions_per_server, keep_servers=keep_servers,
                                 action_field=action_field, action_parser=action_parser,
                                 observation_field=observation_field, connect_timeout=connect_timeout,
                                 read_timeout=read_timeout, start_timeout=start_timeout, retries=retries)
        if call_timeout_s is None:
            call_timeout_s = default_call_timeout(connect_timeout, read_timeout, start_timeout, retries)
        super().__init__(episode, snapshot=snapshot, max_turns=max_turns, call_timeout_s=call_timeout_s,
                         max_observation_chars=max_observation_chars)

    @property
    def server_pid(self) -> int | None:
        """The pid of the server this instance started or shares (``None`` for a URL)."""
        return self.episode.server_pid


def default_call_timeout(connect_timeout: float, read_timeout: float, start_timeout: float, retries: int) -> float:
    """The boundary's deadline for one reset or step when none is given: the longest the
    session's own timeouts allow (a server boot, then every attempt connecting and reading,
    with a replayed turn's read each), at least the boundary's default."""
    from trace_gym.env.boundary import DEFAULT_CALL_TIMEOUT_S

    return max(DEFAULT_CALL_TIMEOUT_S, start_timeout + (retries + 2) * (connect_timeout + 2 * read_timeout))


def is_url(name: str) -> bool:
    """Whether an id names a running server (``http(s)://`` or ``ws(s)://``)."""
    return re.match(r"(https?|wss?)://", name) is not None


# --- what the registry calls --------------------------------------------------------------


def load_tasks(n: int, seed: int = 0, *, name: str, reset_kwargs: Mapping[str, Any] | None = None) -> list[Task]:
    """``n`` tasks of an OpenEnv env, which has no dataset: a task is a reset seed
    (``seed``, ``seed + 1``, ...), with ``reset_kwargs`` for the env's ``reset`` when given;
    ids ``<name>/seed<N>``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"openenv:{name}: load_tasks needs n >= 1, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"openenv:{name}: the first seed must be an int >= 0, got {seed!r}")
    if reset_kwargs is not None and (not isinstance(reset_kwargs, Mapping) or "seed" in reset_kwargs):
        raise ValueError(f"openenv:{name}: reset_kwargs must be a mapping without 'seed' (each task is a seed), "
                         f"got {reset_kwargs!r}")
    extra = {"reset_kwargs": dict(reset_kwargs)} if reset_kwargs else {}
    return [Task(id=f"{name}/seed{s}", prompt="", source="openenv", metadata={"seed": s, **extra})
            for s in range(seed, seed + n)]


def _discovery_module() -> Any:
    """OpenEnv's ``openenv.auto._discovery``, loaded alone: the module needs only the standard
    library and yaml, while importing it as ``openenv.auto``'s submodule first runs that
    package's ``__init__``, which imports the server stack (gradio: 5-12 s, most of what
    ``trace-gym envs`` spent). Falls back to the plain import if the file cannot be loaded alone."""
    import importlib.util
    import sys

    name = "_trace_gym_openenv_discovery"
    if name in sys.modules:
        return sys.modules[name]
    try:
        package = importlib.util.find_spec("openenv")
        folders = list(package.submodule_search_locations or []) if package else []
        spec = importlib.util.spec_from_file_location(name, os.path.join(folders[0], "auto", "_discovery.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
        return module
    except Exception:  # noqa: BLE001 - another layout of openenv: the import it documents
        sys.modules.pop(name, None)
        import openenv.auto._discovery as module

        return module


def _discovery() -> Any:
    # OpenEnv's AutoEnv finds installed openenv-* packages with this; there is no public listing
    discovery = _discovery_module().get_discovery()
    discovery.discover(use_cache=False)  # its file cache may list packages since uninstalled
    return discovery


def available() -> list[str]:
    """The installed OpenEnv env packages (``openenv-<name>``) that OpenEnv's discovery finds."""
    return sorted(_discovery().discover())


def installed_app(name: str) -> str:
    """``"module.server.app:app"`` of the installed env package ``name`` (its manifest's ``app``).

    Raises:
        ValueError: no installed package of that name (the installed ones named).
    """
    info = _discovery().get_environment_by_name(name)
    if info is None:
        from trace_gym.utils.suggest import did_you_mean

        found = available()
        raise ValueError(f"openenv:{name}: no installed OpenEnv env package is named {name!r} (installed: "
                         f"{found or 'none'}){did_you_mean(name, found)}; give server_cmd='module:app' to start a "
                         "server, or name a running one as openenv:<URL>")
    module = info.client_module_path.rsplit(".", 1)[0]
    return f"{module}.{(info.manifest or {}).get('app', 'server.app:app')}"


def family(name: str, options: Mapping[str, Any], env_kwargs: Mapping[str, Any],
           task_kwargs: Mapping[str, Any]):
    """The :class:`~trace_gym.env.family.EnvFamily` of ``openenv:<name>`` (module docstring);
    ``options`` (an ``?k=v`` tail) set env kwargs, or ``reset_kwargs`` of the tasks."""
    from trace_gym.env.family import adapter_family

    where = f"openenv:{name}"
    env = {**{k: v for k, v in options.items() if k not in TASK_OPTIONS}, **env_kwargs}
    tasks = {**{k: v for k, v in options.items() if k in TASK_OPTIONS}, **task_kwargs}
    options_of(env, ENV_OPTIONS, where)
    options_of(tasks, TASK_OPTIONS, f"{where} tasks")
    if not is_url(name) and env.get("server_cmd") is None:
        env["server_cmd"] = installed_app(name)
    OpenEnvAdapter(name, **env).close()  # every option checked now, in one line; starts nothing
    load_tasks(1, name=name, **tasks)
    how = "the server at that URL" if is_url(name) else f"a server started from {env['server_cmd']!r}"
    return adapter_family(PREFIX, name, ENTRY_POINT, env_kwargs={"name": name, **env}, task_loader=TASK_LOADER,
                          loader_kwargs={"name": name, **tasks}, description=f"OpenEnv env {name}: {how}")
