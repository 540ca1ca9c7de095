"""One adapter instance's websocket session to an OpenEnv server: the transport and its retries.

:class:`OpenEnvSession` opens OpenEnv's ``GenericEnvClient`` session on first use (for an
``openenv:<name>`` id on a server it starts or shares through
:mod:`~environments.ecosystems.openenv_server`) and answers a reset or a step as
``(observation dict, reward float, done bool)``: a reset is retried while the server cannot
be reached or is at capacity; a step whose connection dropped while the server lives is
resumed on a new session by replaying the episode (each answer checked); every other
failure is one :class:`~environments.ecosystems.openenv_server.OpenEnvError` line naming
the URL, a reply that is not a JSON object within :data:`MAX_REPLY_DEPTH` levels (read with
:func:`~trace_gym.utils.textsafe.loads_bounded` before OpenEnv's client parses it) included. The
observation's text, ``reward`` and ``done`` are passed on as the server sent them; the
adapter's boundary cleans, bounds and checks them. The policy is the one :mod:`environments.ecosystems.openenv` documents under
"Timeouts and retries"; openenv and websockets are imported on first use.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
import urllib.request
import weakref
from typing import Any, Mapping, Sequence

from environments.ecosystems.openenv_server import _LOCAL, OpenEnvError, _acquire, _release, _SharedServer, _wait_ready
from trace_gym.env.boundary import error_text
from trace_gym.utils.textsafe import JSONRefused, clean_text, loads_bounded

#: how OpenEnv's EnvClient reports an error message from the server
_SERVER_ERROR = re.compile(r"^Server error: (?P<message>.*) \(code: (?P<code>\w+)\)$", re.DOTALL)

# the adapter's logger: one name for every warning of an OpenEnv episode
_log = logging.getLogger("environments.ecosystems.openenv")
#: deepest nesting of a server's reply that is parsed (an observation's JSON inside it)
MAX_REPLY_DEPTH = 64
#: longest run of digits in a server's reply that is parsed
MAX_REPLY_DIGITS = 400


class BadReply(Exception):
    """A server reply this client cannot read; the message is a predicate (``is not valid JSON ...``)."""


def _one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line, cut to ``limit`` characters, lone surrogates escaped (a server's words)."""
    return clean_text(" ".join(str(text).split())[:limit])


def _backoff(attempt: int) -> float:
    """Seconds before retry ``attempt`` (1, 2, ...): 0.25, 0.5, 1.0, ..."""
    return 0.25 * 2 ** (attempt - 1)


@functools.cache
def _client_class() -> type:
    """OpenEnv's ``GenericEnvClient``, reading each reply with bounds before parsing it (its
    own ``_receive`` calls ``json.loads``, which raises ``RecursionError`` on deep nesting)."""
    from openenv.core.generic_client import GenericEnvClient  # imports fastapi, gradio, mcp: seconds

    class BoundedClient(GenericEnvClient):
        async def _receive(self) -> dict:  # openenv-core 0.3.0's EnvClient._receive, bounded
            raw = await asyncio.wait_for(self._ws.recv(), timeout=self._message_timeout)
            try:
                reply = loads_bounded(raw, max_depth=MAX_REPLY_DEPTH, max_digits=MAX_REPLY_DIGITS)
            except JSONRefused as exc:
                raise BadReply(str(exc)) from None
            if not isinstance(reply, dict) or not isinstance(reply.get("data", {}), dict):
                raise BadReply(f"is not a JSON object with a 'data' object (it starts {str(raw)[:80]!r})")
            return reply

    return BoundedClient


def _is_connection_error(exc: BaseException) -> bool:
    from websockets.exceptions import ConnectionClosed

    return isinstance(exc, (ConnectionError, OSError, EOFError, ConnectionClosed))


def _server_error(exc: BaseException) -> tuple[str, str] | None:
    """``(code, message)`` of an error answer of the server (the session survives it)."""
    found = _SERVER_ERROR.match(str(exc)) if isinstance(exc, RuntimeError) else None
    return None if found is None else (found.group("code"), found.group("message"))


def _answer(result: Any) -> tuple:
    """``(observation dict, reward, done)`` of an OpenEnv ``StepResult``: a missing reward
    is 0.0 (OpenEnv's ``None``); reward and done otherwise as sent (the boundary checks them).

    Raises:
        BadReply: an observation that is not a JSON object.
    """
    observation = {} if result.observation is None else result.observation
    if not isinstance(observation, dict):
        raise BadReply(f"holds an observation that is not a JSON object ({str(observation)[:80]!r})")
    return dict(observation), 0.0 if result.reward is None else result.reward, result.done


def _close_client(client: Any, where: str) -> None:
    try:
        client.close()
    except Exception as exc:  # noqa: BLE001  (closing a broken connection: nothing left to save)
        _log.debug("%s: closing the session: %s", where, error_text(exc))


class OpenEnvSession:
    """One websocket session (its own ``Environment`` instance on the server), reopened as needed.

    Args:
        where: ``openenv:<name>``, the start of every error.
        url: the running server's URL, or ``None`` to start a server from ``server_cmd``.
        server_cmd, server_env, sessions_per_server, keep_servers: how a server is started
            and shared (:func:`~environments.ecosystems.openenv_server._acquire`).
        connect_timeout, read_timeout, start_timeout: seconds.
        retries: extra attempts after a connection failure.
    """

    def __init__(self, where: str, url: str | None, *, server_cmd: str | Sequence[str] | None,
                 server_env: Mapping[str, str], sessions_per_server: int, keep_servers: bool,
                 connect_timeout: float, read_timeout: float, start_timeout: float, retries: int):
        self.where, self.url = where, url
        self.server_cmd, self.server_env = server_cmd, server_env
        self.sessions_per_server, self.keep_servers = sessions_per_server, keep_servers
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.start_timeout, self.retries = start_timeout, retries
        self._server: _SharedServer | None = None
        self._release_server: weakref.finalize | None = None
        self.client: Any = None  # a SyncEnvClient holding this session
        self._episode: tuple[int, dict] = (0, {})  # (seed, reset kwargs) of the current episode
        self._trail: list[tuple[dict | None, tuple]] = []  # (payload, answer) per reset/step

    @property
    def server_pid(self) -> int | None:
        """The pid of the server this session started or shares (``None`` for a URL)."""
        return None if self._server is None else self._server.process.pid

    def reset(self, seed: int, kwargs: Mapping[str, Any]) -> tuple:
        """``(observation, reward, done)`` of a reset with ``seed``, which begins the episode
        a dropped connection resumes."""
        answer = self._reset_remote(seed, kwargs)
        self._episode, self._trail = (seed, dict(kwargs)), [(None, answer)]
        return answer

    def step(self, payload: dict) -> tuple[tuple, int]:
        """``((observation, reward, done), reconnects)`` of one step of the episode."""
        answer, reconnects = self._step_remote(payload)
        self._trail.append((payload, answer))
        return answer, reconnects

    def close(self) -> None:
        """Close the session and let go of the started server (it may outlive this, shared or kept)."""
        self._drop_session()
        if self._release_server is not None:
            self._release_server()  # a finalizer: runs once, also if the session is collected unclosed
        self._server = self._release_server = None

    def base_url(self) -> str:
        return self.url if self.url is not None else self._server.process.url

    # -- the server and the session -------------------------------------------------------
    def _ensure_server(self) -> None:
        """A live started server for this session (none for a URL)."""
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
        """This session's client (opened on first use); a started server that died is
        replaced only when ``may_start`` (a reset), else that is an error."""
        if self.client is None:
            dead = None if may_start else self._dead_server()
            if dead is not None:
                raise dead
            self._ensure_server()
            client = _client_class()(base_url=self.base_url(), connect_timeout_s=self.connect_timeout,
                                     message_timeout_s=self.read_timeout).sync()
            try:
                client.connect()
            except BaseException:
                _close_client(client, self.where)
                raise
            self.client = client
        return self.client

    def _drop_session(self) -> None:
        client, self.client = self.client, None
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
        url = self.base_url()
        if code == "VALIDATION_ERROR" and payload is not None:
            return OpenEnvError(f"{self.where}: the env rejected the action {json.dumps(payload, default=str)[:200]}: "
                                f"it does not fit the env's Action schema{self._action_schema()}; map the model's "
                                "text with action_field= or action_parser='module:function'")
        if code == "CAPACITY_REACHED":
            return OpenEnvError(f"{self.where}: the server at {url} is at capacity ({_one_line(message)}): each "
                                "adapter instance holds one websocket session; serve the app with a larger "
                                "max_concurrent_envs, or raise sessions_per_server only as far as it admits")
        return OpenEnvError(f"{self.where}: the env at {url} failed on {kind}: {_one_line(message)} ({code})")

    def _bad_reply(self, kind: str, exc: BadReply) -> OpenEnvError:
        return OpenEnvError(f"{self.where}: the server at {self.base_url()} answered {kind} with a reply that "
                            f"{_one_line(str(exc), 300)}")

    def _action_schema(self) -> str:
        """`` (fields [...], required [...])`` from the server's ``GET /schema``, or ``""``."""
        try:
            opener = _LOCAL if self.url is None else urllib.request.build_opener()  # loopback: no proxy
            with opener.open(f"{self.base_url()}/schema", timeout=self.connect_timeout) as answer:
                schema = json.load(answer)["action"]
            return f" (fields {sorted(schema.get('properties', {}))}, required {sorted(schema.get('required', []))})"
        except Exception as exc:  # noqa: BLE001  (only an explanation is lost)
            _log.debug("%s: GET /schema failed: %s", self.where, error_text(exc))
            return ""

    # -- reset and step, with their retries -------------------------------------------------
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
                raise OpenEnvError(f"{self.where}: the server at {self.base_url()} gave no answer to reset within "
                                   f"read_timeout={self.read_timeout:g} s") from None
            except BadReply as exc:
                self._drop_session()
                raise self._bad_reply("reset", exc) from None
            except Exception as exc:  # noqa: BLE001  (sorted below: retried, explained, or raised)
                answered = _server_error(exc)
                if answered is None and not _is_connection_error(exc):
                    raise
                self._drop_session()
                transient = answered is None or answered[0] == "CAPACITY_REACHED"
                if not transient or attempt >= self.retries:
                    if answered is not None:
                        raise self._answer_error("reset", *answered) from None
                    raise OpenEnvError(f"{self.where}: cannot reach the OpenEnv server at {self.base_url()} "
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
                if self.client is None:
                    self._resume()
                return _answer(self.client.step(payload)), reconnects
            except OpenEnvError:
                raise
            except TimeoutError:
                self._drop_session()  # it may still run that step: never reuse this session
                raise OpenEnvError(f"{self.where}: the server at {self.base_url()} gave no answer to the step "
                                   f"within read_timeout={self.read_timeout:g} s; this episode ends here") from None
            except BadReply as exc:
                self._drop_session()
                raise self._bad_reply("the step", exc) from None
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
                    f"{self.where}: lost the connection to {self.base_url()} ({_one_line(error_text(exc))}) and "
                    f"{reconnects} reconnects did not bring it back; this episode ends here")) from None

    def _resume(self) -> None:
        """A new session at the point the episode had reached: reset with its seed and
        re-send its actions, each answer checked against the first time's."""
        _log.warning("%s: the connection to %s dropped mid-episode; resuming on a new session (%d steps replayed)",
                     self.where, self.base_url(), len(self._trail) - 1)
        seed, kwargs = self._episode
        client = self._connected(may_start=False)
        for turn, (payload, expected) in enumerate(self._trail):
            got = _answer(client.reset(seed=seed, **kwargs) if payload is None else client.step(payload))
            if got != expected:
                raise OpenEnvError(f"{self.where}: resuming after a dropped connection, turn {turn} answered "
                                   f"differently ({json.dumps(got[0], default=str)[:200]}); the env is not "
                                   "deterministic under its seed")
