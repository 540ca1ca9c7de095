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
else its only string field, else the whole observation as JSON (sorted keys).

## Rewards
The step response's ``reward`` (``None`` is 0.0).

## Episode End
Terminated when the server says ``done``; truncated after ``max_turns`` steps, and on any
failure of the server (dead, slow beyond ``read_timeout``, an error in the env's ``step``):
that turn carries ``info["env_error"]`` and an observation the model can read, and only
that episode ends. A ``reset`` (or a restore) that cannot reach the server raises
:class:`OpenEnvError`, one line naming the URL: there is no episode yet to end.

## Snapshot
``replay`` only: OpenEnv's ``state`` is metadata, not the world, so a snapshot is the task,
the seed and the actions; ``restore`` resets the same session with that seed and re-sends
the actions, each answer checked against the recorded one
(:class:`~trace_gym.env_adapter.ReplayDivergence` otherwise). The env must draw its
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
a server boot each) until :func:`stop_servers` or the interpreter exits. A server that
dies is never restarted mid-episode; the next ``reset`` starts a new one (logged as a
warning). A server at a URL is never started or stopped by the adapter, and must admit
one session per live instance.

## Timeouts and retries (seconds)
``connect_timeout`` (5.0): opening the websocket and each ``/health`` probe.
``read_timeout`` (60.0): each answer to a reset or step. ``start_timeout`` (60.0): a
started server's boot. ``retries`` (2): extra attempts, 0.25 s, 0.5 s, ... apart, for a
reset that cannot connect (or finds the server at capacity), and for a step whose
connection dropped while the server lives (a new session replays the episode, checked,
then the step is sent). A step is never re-sent on a session that may have run it, and a
read timeout is not retried.

## Version History
v0: first version, for ``openenv-core`` 0.3.0.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import time
import urllib.request
import weakref
from typing import Any, Callable, Mapping, Sequence

from environments.ecosystems.openenv_server import (  # noqa: F401  (free_port, live_servers: public here too)
    OpenEnvError, _acquire, _release, _SharedServer, _wait_ready, free_port, live_servers, server_command, stop_servers,
)
from trace_gym.env_adapter import AdaptedEnv, error_text, options_of
from trace_gym.types import Message, Task

PACKAGE = "openenv-core"
ADAPTER = "environments.ecosystems.openenv:OpenEnvAdapter"
TASK_LOADER = "environments.ecosystems.openenv:load_tasks"
#: keyword arguments of :class:`OpenEnvAdapter` an id may set (``name`` comes from the id)
ENV_OPTIONS = ("server_cmd", "server_env", "sessions_per_server", "keep_servers", "action_field",
               "action_parser", "observation_field", "connect_timeout", "read_timeout", "start_timeout",
               "retries", "max_turns", "snapshot")
#: keyword arguments of :func:`load_tasks` an id may set
TASK_OPTIONS = ("reset_kwargs",)
#: tasks a ``reset()`` without ``options["task"]`` draws from (seeds 0..N-1)
DEFAULT_POOL = 100
#: how OpenEnv's EnvClient reports an error message from the server
_SERVER_ERROR = re.compile(r"^Server error: (?P<message>.*) \(code: (?P<code>\w+)\)$", re.DOTALL)

_log = logging.getLogger(__name__)



def _one_line(text: str, limit: int = 600) -> str:
    return " ".join(str(text).split())[:limit]


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): 0.25, 0.5, 1.0, ..."""
    return 0.25 * 2 ** (attempt - 1)


# --- text <-> OpenEnv JSON ------------------------------------------------------------


def load_object(target: str, what: str) -> Any:
    """The object ``"module:attr"`` names; one line naming ``target`` when it cannot."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} must be 'module:function', got {target!r}")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what}={target!r} cannot be loaded ({error_text(exc)})") from None
    return obj


def action_payload(text: str, action_field: str, parser: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The env's Action JSON for the model's ``text``: ``parser(text)`` (a dict or a
    pydantic model) when given, else ``{action_field: text}``.

    Raises:
        TypeError: a parser that returns something else (named).
    """
    if parser is None:
        return {action_field: text}
    made = parser(text)
    if hasattr(made, "model_dump"):
        made = made.model_dump()
    if not isinstance(made, Mapping):
        raise TypeError(f"action_parser returned {type(made).__name__} {made!r:.100}; it must return a dict "
                        "(the env's Action JSON) or a pydantic Action")
    return dict(made)


def render_observation(observation: Mapping[str, Any], field: str | None = None) -> str:
    """The text of an OpenEnv observation (its JSON without ``reward``/``done``/``metadata``):
    ``observation[field]`` when ``field`` is given, else its only string-valued field, else
    the whole observation as JSON with sorted keys. Non-string values are written as JSON.

    Raises:
        ValueError: ``field`` is not in the observation (its fields named).
    """
    if field is not None:
        if field not in observation:
            raise ValueError(f"observation_field={field!r} is not in the observation; it has {sorted(observation)}")
        value = observation[field]
    else:
        strings = [key for key, value in observation.items() if isinstance(value, str)]
        value = observation[strings[0]] if len(strings) == 1 else dict(observation)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


# --- servers this process starts --------------------------------------------------------


def _client_class() -> type:
    from openenv.core.generic_client import GenericEnvClient  # imports fastapi, gradio, mcp: seconds

    return GenericEnvClient


def _is_connection_error(exc: BaseException) -> bool:
    from websockets.exceptions import ConnectionClosed

    return isinstance(exc, (ConnectionError, OSError, EOFError, ConnectionClosed))


def _server_error(exc: BaseException) -> tuple[str, str] | None:
    """``(code, message)`` of an error answer of the server (the session survives it)."""
    found = _SERVER_ERROR.match(str(exc)) if isinstance(exc, RuntimeError) else None
    return None if found is None else (found.group("code"), found.group("message"))


# --- the adapter ----------------------------------------------------------------------


class OpenEnvAdapter(AdaptedEnv):
    """An OpenEnv env server as an :class:`~trace_gym.env.AgentEnv` (see the module docstring).

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
    """

    snapshot_strategies = ("replay",)

    def __init__(self, name: str, *, server_cmd: str | Sequence[str] | None = None,
                 server_env: Mapping[str, str] | None = None, sessions_per_server: int = 1,
                 keep_servers: bool = False,
                 action_field: str = "message", action_parser: str | None = None,
                 observation_field: str | None = None, connect_timeout: float = 5.0, read_timeout: float = 60.0,
                 start_timeout: float = 60.0, retries: int = 2, max_turns: int | None = None,
                 snapshot: str | None = None):
        super().__init__(snapshot=snapshot, max_turns=max_turns)
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
        self._server: _SharedServer | None = None
        self._release_server: weakref.finalize | None = None
        self._client: Any = None  # a SyncEnvClient holding this instance's session
        self._episode: tuple[int, dict] = (0, {})  # (seed, reset kwargs) of the current episode
        self._trail: list[tuple[dict | None, tuple]] = []  # (payload, answer) per reset/step
        self._pool: list[Task] | None = None

    # -- AdaptedEnv -------------------------------------------------------------------
    @property
    def env_key(self) -> str:
        return f"{type(self).__name__}:{self.name}"

    @property
    def server_pid(self) -> int | None:
        """The pid of the server this instance started or shares (``None`` for a URL)."""
        return None if self._server is None else self._server.process.pid

    def _default_tasks(self) -> Sequence[Task]:
        if self._pool is None:
            self._pool = load_tasks(DEFAULT_POOL, name=self.name)
        return self._pool

    def _load_task(self, task_id: str) -> Task:
        found = re.fullmatch(r".+/seed(\d+)", task_id)
        if found is None:
            raise ValueError(f"{self.where}: task id {task_id!r} is not '<name>/seed<N>'")
        return Task(id=task_id, prompt="", source="openenv", metadata={"seed": int(found.group(1))})

    def _begin(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        kwargs = dict(task.metadata.get("reset_kwargs") or {})
        try:
            answer = self._reset_remote(seed, kwargs)
            text = render_observation(answer[0], self.observation_field)
        except BaseException:
            self._task = None  # no episode began: step() asks for a reset
            raise
        self._episode, self._trail = (seed, kwargs), [(None, answer)]
        self.inner = self._client
        return [Message("user", text)], {"openenv_url": self._url()}

    def _act(self, action: str):
        payload = action_payload(action, self.action_field, self.parser)
        answer, reconnects = self._step_remote(payload)
        self._trail.append((payload, answer))
        observation, reward, done = answer
        info = {"env_reconnects": reconnects} if reconnects else {}
        return [Message("user", render_observation(observation, self.observation_field))], reward, done, False, info

    def close(self) -> None:
        super().close()
        self._drop_session()
        if self._release_server is not None:
            self._release_server()  # a finalizer: runs once, also if the instance is collected unclosed
        self._server = self._release_server = None

    # -- the server and the session -------------------------------------------------------
    def _url(self) -> str:
        return self.url if self.url is not None else self._server.process.url

    def _ensure_server(self) -> None:
        """A live started server for this instance (none for a URL)."""
        if self.url is not None:
            return
        if self._server is not None and not self._server.process.alive():
            proc = self._server.process
            _log.warning("%s: the server at %s (pid %s) exited with code %s; starting a new one for this reset",
                         self.where, proc.url, proc.pid, proc.returncode)
            self._release_server()
            self._server = self._release_server = None
        if self._server is None:
            self._server = _acquire(self.server_cmd, self.server_env, self.sessions_per_server, self.keep_servers,
                                    self.where)
            self._release_server = weakref.finalize(self, _release, self._server)
            try:
                _client_class()  # the client's (slow) import overlaps the server's boot
                _wait_ready(self._server, self.start_timeout, self.connect_timeout)
            except BaseException:
                self._release_server()
                self._server = self._release_server = None
                raise

    def _connected(self, *, may_start: bool = True) -> Any:
        """This instance's session (opened on first use); a started server that died is
        replaced only when ``may_start`` (a reset), else that is an error."""
        if self._client is None:
            dead = None if may_start else self._dead_server()
            if dead is not None:
                raise dead
            self._ensure_server()
            client = _client_class()(base_url=self._url(), connect_timeout_s=self.connect_timeout,
                                     message_timeout_s=self.read_timeout).sync()
            try:
                client.connect()
            except BaseException:
                _close_client(client, self.where)
                raise
            self._client = client
        return self._client

    def _drop_session(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            _close_client(client, self.where)

    def _dead_server(self) -> OpenEnvError | None:
        """Why the started server is gone, or ``None`` while it lives (or for a URL)."""
        if self._server is None or self._server.process.alive():
            return None
        proc = self._server.process
        return OpenEnvError(f"{self.where}: the OpenEnv server at {proc.url} (pid {proc.pid}) exited with code "
                            f"{proc.returncode} mid-episode; this episode ends here and the next reset starts a "
                            f"new server (its log ends: {proc.log_tail() or 'nothing'})")

    def _answer_error(self, kind: str, code: str, message: str, payload: dict | None = None) -> OpenEnvError:
        url = self._url()
        if code == "VALIDATION_ERROR" and payload is not None:
            return OpenEnvError(f"{self.where}: the env rejected the action {json.dumps(payload, default=str)[:200]}: "
                                f"it does not fit the env's Action schema{self._action_schema()}; map the model's "
                                "text with action_field= or action_parser='module:function'")
        if code == "CAPACITY_REACHED":
            return OpenEnvError(f"{self.where}: the server at {url} is at capacity ({_one_line(message)}): each "
                                "adapter instance holds one websocket session; serve the app with a larger "
                                "max_concurrent_envs, or raise sessions_per_server only as far as it admits")
        return OpenEnvError(f"{self.where}: the env at {url} failed on {kind}: {_one_line(message)} ({code})")

    def _action_schema(self) -> str:
        """`` (fields [...], required [...])`` from the server's ``GET /schema``, or ``""``."""
        try:
            opener = _LOCAL if self.url is None else urllib.request.build_opener()  # loopback: no proxy
            with opener.open(f"{self._url()}/schema", timeout=self.connect_timeout) as answer:
                schema = json.load(answer)["action"]
            return f" (fields {sorted(schema.get('properties', {}))}, required {sorted(schema.get('required', []))})"
        except Exception as exc:  # noqa: BLE001  (only an explanation is lost)
            _log.debug("%s: GET /schema failed: %s", self.where, error_text(exc))
            return ""

    def _reset_remote(self, seed: int, kwargs: Mapping[str, Any]) -> tuple:
        """``(observation, reward, done)`` of a reset with ``seed``, retried while the server
        cannot be reached or is at capacity."""
        attempt = 0
        while True:
            try:
                return _answer(self._connected().reset(seed=seed, **kwargs))
            except OpenEnvError:
                raise  # a started server that failed to boot: already one line
            except TimeoutError:
                self._drop_session()
                raise OpenEnvError(f"{self.where}: the server at {self._url()} gave no answer to reset within "
                                   f"read_timeout={self.read_timeout:g} s") from None
            except Exception as exc:  # noqa: BLE001  (sorted below: retried, explained, or raised)
                answered = _server_error(exc)
                if answered is None and not _is_connection_error(exc):
                    raise
                self._drop_session()
                transient = answered is None or answered[0] == "CAPACITY_REACHED"
                if not transient or attempt >= self.retries:
                    if answered is not None:
                        raise self._answer_error("reset", *answered) from None
                    raise OpenEnvError(f"{self.where}: cannot reach the OpenEnv server at {self._url()} "
                                       f"({_one_line(error_text(exc))}) after {attempt + 1} attempts; is it "
                                       "running there?") from None
                attempt += 1
                time.sleep(_backoff(attempt))

    def _step_remote(self, payload: dict) -> tuple[tuple, int]:
        """``((observation, reward, done), reconnects)`` of one step; a dropped connection
        to a live server is resumed on a new session (bounded by ``retries``)."""
        reconnects = 0
        while True:
            try:
                if self._client is None:
                    self._resume()
                return _answer(self._client.step(payload)), reconnects
            except OpenEnvError:
                raise
            except TimeoutError:
                self._drop_session()  # it may still run that step: never reuse this session
                raise OpenEnvError(f"{self.where}: the server at {self._url()} gave no answer to the step within "
                                   f"read_timeout={self.read_timeout:g} s; this episode ends here") from None
            except Exception as exc:  # noqa: BLE001  (sorted below: resumed, explained, or raised)
                answered = _server_error(exc)
                if answered is not None:
                    raise self._answer_error("step", *answered, payload) from None
                if not _is_connection_error(exc):
                    raise
                self._drop_session()
                dead = self._dead_server()
                if dead is None and reconnects < self.retries:
                    reconnects += 1
                    time.sleep(_backoff(reconnects))
                    dead = self._dead_server()
                    if dead is None:
                        continue
                raise (dead or OpenEnvError(
                    f"{self.where}: lost the connection to {self._url()} ({_one_line(error_text(exc))}) and "
                    f"{reconnects} reconnects did not bring it back; this episode ends here")) from None

    def _resume(self) -> None:
        """A new session at the point the episode had reached: reset with its seed and
        re-send its actions, each answer checked against the first time's."""
        _log.warning("%s: the connection to %s dropped mid-episode; resuming on a new session (%d steps replayed)",
                     self.where, self._url(), len(self._trail) - 1)
        seed, kwargs = self._episode
        client = self._connected(may_start=False)
        for turn, (payload, expected) in enumerate(self._trail):
            got = _answer(client.reset(seed=seed, **kwargs) if payload is None else client.step(payload))
            if got != expected:
                raise OpenEnvError(f"{self.where}: resuming after a dropped connection, turn {turn} answered "
                                   f"differently ({json.dumps(got[0], default=str)[:200]}); the env is not "
                                   "deterministic under its seed")


def _answer(result: Any) -> tuple:
    """``(observation dict, reward float, done bool)`` of an OpenEnv ``StepResult``."""
    reward = 0.0 if result.reward is None else float(result.reward)
    return dict(result.observation or {}), reward, bool(result.done)


def _close_client(client: Any, where: str) -> None:
    try:
        client.close()
    except Exception as exc:  # noqa: BLE001  (closing a broken connection: nothing left to save)
        _log.debug("%s: closing the session: %s", where, error_text(exc))


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


def _discovery() -> Any:
    # OpenEnv's AutoEnv finds installed openenv-* packages with this; there is no public listing
    from openenv.auto._discovery import get_discovery

    discovery = get_discovery()
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
        from trace_gym.config import did_you_mean

        found = available()
        raise ValueError(f"openenv:{name}: no installed OpenEnv env package is named {name!r} (installed: "
                         f"{found or 'none'}){did_you_mean(name, found)}; give server_cmd='module:app' to start a "
                         "server, or name a running one as openenv:<URL>")
    module = info.client_module_path.rsplit(".", 1)[0]
    return f"{module}.{(info.manifest or {}).get('app', 'server.app:app')}"


def family(name: str, options: Mapping[str, Any], env_kwargs: Mapping[str, Any],
           task_kwargs: Mapping[str, Any]):
    """The :class:`~trace_gym.registry.EnvFamily` of ``openenv:<name>`` (module docstring);
    ``options`` (an ``?k=v`` tail) set env kwargs, or ``reset_kwargs`` of the tasks."""
    from trace_gym.registry import adapter_family

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
    return adapter_family("openenv", name, ADAPTER, env_kwargs={"name": name, **env}, task_loader=TASK_LOADER,
                          loader_kwargs={"name": name, **tasks}, description=f"OpenEnv env {name}: {how}")
