"""The one boundary every call into another ecosystem's env, and every reply, crosses.

:class:`ForeignBoundary` is what an adapter (:mod:`trace_gym.env.adapter`) calls foreign
code through, and what it checks each reply with. It guarantees:

* **a deadline per call** (``call_timeout_s``): each call runs on a helper thread of its
  own; a call with no reply by then is given up: its episode ends (a step: truncated,
  with ``info["env_error"]``; a reset: :class:`ForeignEnvError`), the locks and process
  state it held are released and put back at once, and the helper is sent an exception
  so that a pure-Python loop stops (a thread blocked in C cannot take it: it is taken back,
  :mod:`trace_gym.env.thread_raise`). No lock is held across a foreign call, so a hung
  call holds up no other env's calls (the private RNG below is per thread). An instance whose call is still
  running :data:`GIVE_UP_GRACE_S` later takes no further call (:class:`ForeignEnvError`;
  make a new env).
* **exceptions contained**: an ``Exception`` of the foreign code reaches the adapter as it
  was raised; any other ``BaseException`` it raises (``SystemExit``, ``KeyboardInterrupt``,
  ``GeneratorExit``, its own) becomes a :class:`ForeignEnvError`, so it ends that episode
  only. The rule that keeps a real Ctrl-C working: foreign code never runs on the main
  thread, and Python delivers signals to the main thread only; so an exception raised on
  a helper thread was raised by foreign code, while a ``KeyboardInterrupt`` from a SIGINT
  (the user's Ctrl-C, ``kill -INT``, or foreign code calling ``os.kill`` on us, which
  cannot be told apart) lands in the waiting caller, gives the call up and propagates.
* **process state put back** after each call (:mod:`trace_gym.env.process_state`), and
  private global RNGs for envs that draw from ``random``/``numpy.random``: the call's
  helper thread is bound to a working copy of the env's own generators
  (:func:`~trace_gym.env.process_state.bind_generators`), which become the env's when the
  call returns (a call given up leaves the env's generators as they were).
* **replies inside the contract** (:meth:`ForeignBoundary.observation`,
  :meth:`~ForeignBoundary.step_reply`, :meth:`~ForeignBoundary.reset_reply`): every text
  cleaned (:func:`~trace_gym.utils.textsafe.clean_text`: lone surrogates written as ``\\udXXX``)
  and bounded like a native observation (``max_observation_chars`` over at most
  :data:`MAX_OBSERVATION_MESSAGES` messages, with a visible note where cut and
  ``info["obs_truncated"]``); ``terminated``/``truncated`` only ``True``/``False``, the
  reward only a finite real number within :data:`MAX_ABS_REWARD`, ``info`` a dict without
  reference cycles of at most :data:`MAX_INFO_CHARS` characters as JSON, else
  :class:`ForeignReplyError`, which the adapter turns into a readable observation that
  ends the episode as truncated. :attr:`ForeignBoundary.fingerprint` digests the last
  observation whole, before any cut, for replay's divergence check.

What an in-process boundary cannot contain (a worker process would): ``os._exit``, a
crash in C, memory exhaustion, a C loop that never returns to Python (its thread stays).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import math
import numbers
import threading
import time
from typing import Any, Callable, Mapping

import numpy as np

from trace_gym.env import process_state, thread_raise
from trace_gym.env.process_state import BASELINE, GLOBAL_RNG_LOCK, PrivateGenerators, bind_generators, global_rng_state
from trace_gym.utils.textsafe import JSONRefused, cap_text, clean_text, clean_value, loads_bounded
from trace_gym.types import Message

#: Default seconds one foreign call (reset, step, snapshot, restore, close) may take.
DEFAULT_CALL_TIMEOUT_S = 300.0
#: Default longest observation of one turn, in characters (the math env's default too).
MAX_OBSERVATION_CHARS = 32768
#: Most messages one observation keeps (the first ones and the last one).
MAX_OBSERVATION_MESSAGES = 64
#: Fewest characters a message keeps when a long observation is shared out.
MIN_MESSAGE_CHARS = 256
#: Longest ``name`` / ``tool_call_id`` of a message, and of a shown bad value.
MAX_FIELD_CHARS = 256
#: Longest error text put into an observation or ``info["env_error"]`` (characters).
MAX_ERROR_CHARS = 2000
#: Largest reward magnitude a foreign env may return (a group's normalisation squares
#: rewards: 1e300 overflows, and a few 1e308 sum to inf).
MAX_ABS_REWARD = 1e6
#: Longest ``info`` of one reply, in characters of its JSON (values that are not JSON as
#: their type's name).
MAX_INFO_CHARS = 1 << 20
#: Seconds a call given up has to stop (the exception sent to its thread) before its env
#: is declared stuck and takes no further call.
GIVE_UP_GRACE_S = 1.0
#: Written where an observation was cut (``{omitted}``: characters).
TRUNCATION_NOTE = "\n[... observation truncated: {omitted} characters omitted ...]\n"
#: Written after the last kept message but one when messages were left out.
OMITTED_NOTE = "\n[... {omitted} more messages omitted ...]"

_log = logging.getLogger(__name__)
_WAIT_SLICE_S = 0.25  # how often a waiting caller looks up from its wait (seconds)
_INSIDE = threading.local()  # depth of boundary calls on this thread (a helper's nested calls run inline)


class ForeignEnvError(RuntimeError):
    """A foreign call that gave no reply within its deadline, or raised a ``BaseException``
    that is not an ``Exception``; one line naming the env, the call and what happened."""


class ForeignReplyError(ValueError):
    """A foreign reply outside our contract (a flag that is not a bool, a reward that is not
    a finite number, an observation that is not a list of messages); names the value."""


class CallGivenUp(BaseException):
    """Raised inside a helper thread whose call the boundary gave up on (stops Python loops)."""


def error_text(exc: BaseException) -> str:
    """``"TypeName: message"``, cleaned and cut to :data:`MAX_ERROR_CHARS` (an exception whose
    ``str`` itself raises is shown by its type)."""
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001  (a foreign __str__: anything)
        message = "<its message could not be read>"
    return clean_text(f"{type(exc).__name__}: {message}"[:MAX_ERROR_CHARS])


def shown(value: Any) -> str:
    """A foreign value for an error message: its ``repr``, cleaned and cut, and its type."""
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001  (a foreign __repr__: anything)
        text = "<unprintable>"
    return f"{clean_text(text[:MAX_FIELD_CHARS])} (a {type(value).__name__})"


class PrivateRandom:
    """The ``(random, numpy.random)`` generators an env draws from in place of the globals
    (``None``: a copy of the process's, made at its first call); :attr:`state` reads and
    sets them as a ``(random, numpy.random)`` state tuple."""

    def __init__(self) -> None:
        self.generators: PrivateGenerators | None = None

    @property
    def state(self) -> tuple | None:
        return None if self.generators is None else self.generators.state

    @state.setter
    def state(self, value: tuple | None) -> None:
        self.generators = None if value is None else PrivateGenerators(value)


class _Call:
    """One foreign call in flight (shared by the caller and the helper, under ``guard``)."""

    def __init__(self, what: str, fn: Callable[..., Any], args: tuple, rng: PrivateRandom | None):
        self.what, self.fn, self.args, self.rng = what, fn, args, rng
        self.started, self.done, self.guard = threading.Event(), threading.Event(), threading.Lock()
        self.closed = self.given_up = self.entered = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.work: PrivateGenerators | None = None  # the helper's working copy of the env's generators
        self.ident: int | None = None
        self.changed: list[str] = []  # process state items put back when it ended


def _wait(event: threading.Event, seconds: float) -> bool:
    """``event.wait(seconds)`` in short slices: a SIGINT that the kernel delivered to another
    thread runs its handler (a ``KeyboardInterrupt``) on the main thread between two slices."""
    deadline = time.monotonic() + seconds
    while not event.wait(min(_WAIT_SLICE_S, max(deadline - time.monotonic(), 0.0))):
        if time.monotonic() >= deadline:
            return False
    return True


class ForeignBoundary:
    """Calls into one env instance's foreign code, and the checks of its replies (module docstring).

    Args:
        call_timeout_s: seconds one call may take (``None``: :data:`DEFAULT_CALL_TIMEOUT_S`).
        max_observation_chars: longest observation of one turn, in characters (``None``:
            :data:`MAX_OBSERVATION_CHARS`).
        subject: whose code the calls run, as messages name it (the boundary also serves a
            strategy's calls: :mod:`trace_gym.step.strategy_boundary`).
    """

    def __init__(self, *, call_timeout_s: float | None = None, max_observation_chars: int | None = None,
                 subject: str = "the env"):
        self.subject = subject  # whose code the calls run, in messages ("the env", "strategy 'x'")
        timeout = DEFAULT_CALL_TIMEOUT_S if call_timeout_s is None else call_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ValueError(f"call_timeout_s must be a positive number of seconds, got {call_timeout_s!r}")
        chars = MAX_OBSERVATION_CHARS if max_observation_chars is None else max_observation_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or chars < 2 * MIN_MESSAGE_CHARS:
            raise ValueError(f"max_observation_chars must be an int >= {2 * MIN_MESSAGE_CHARS}, "
                             f"got {max_observation_chars!r}")
        self.call_timeout_s, self.max_observation_chars = float(timeout), chars
        self._stuck: threading.Thread | None = None  # the helper of a call given up, while it lives
        self._stuck_what = ""
        self._reported: set[str] = set()  # process state items already logged as changed
        self.fingerprint = ""  # of the last observation checked, before any cut (:func:`observation_fingerprint`)

    @property
    def stuck(self) -> bool:
        """Whether a call this boundary gave up on is still running."""
        return self._stuck is not None and self._stuck.is_alive()

    # -- calls -----------------------------------------------------------------------
    def call(self, what: str, fn: Callable[..., Any], *args: Any, where: str, rng: PrivateRandom | None = None) -> Any:
        """``fn(*args)`` on a helper thread, within :attr:`call_timeout_s`, the process state
        put back after it and, with ``rng``, the globals RNGs holding that private state.

        Raises:
            Exception: what ``fn`` raised, as it raised it.
            ForeignEnvError: no reply within the deadline, a ``BaseException`` of ``fn`` that
                is not an ``Exception``, or an earlier call of this boundary still running.
        """
        if getattr(_INSIDE, "depth", 0):
            return fn(*args)  # nested in a call of ours: its deadline and restore cover this
        if self.stuck:
            raise ForeignEnvError(f"{where}: its {self._stuck_what} was given up and is still running; "
                                  f"{self.subject} takes no further call"
                                  + (" (make a new env)" if self.subject == "the env" else ""))
        call = _Call(what, fn, args, rng)
        helper = threading.Thread(target=self._run, args=(call, contextvars.copy_context()), daemon=True,
                                  name=f"foreign-{what}")
        helper.start()
        try:
            _wait(call.started, math.inf)
            _wait(call.done, self.call_timeout_s)
        finally:  # the deadline passed, or the caller was interrupted (a real Ctrl-C)
            if not call.done.is_set() and self._give_up(call, helper):
                helper.join(GIVE_UP_GRACE_S)  # a pure-Python loop stops at the exception sent to it
                if helper.is_alive():  # blocked in C: the exception it cannot take is taken back
                    thread_raise.withdraw(helper)
                    self._stuck, self._stuck_what = helper, what
        if call.given_up:
            raise ForeignEnvError(f"{where}: {self.subject}'s {what} gave no reply within call_timeout_s="
                                  f"{self.call_timeout_s:g} s; given up")
        self._report(call, where)
        if call.error is None:
            return call.value
        if isinstance(call.error, Exception):
            raise call.error
        raise ForeignEnvError(f"{where}: {self.subject}'s {what} raised {error_text(call.error)}") from call.error

    def _run(self, call: _Call, context: contextvars.Context) -> None:
        """The helper thread: begin the call (bound to the env's private generators), run it, end it."""
        _INSIDE.depth = 1
        process_state.bind_thread(call)
        call.ident = threading.get_ident()
        try:
            if self._begin(call):
                try:
                    call.value = context.run(call.fn, *call.args)
                except BaseException as exc:  # noqa: BLE001  (contained: the caller sorts it, see call())
                    call.error = exc
                self._close(call)
        except CallGivenUp:
            pass  # the caller already put everything back
        except BaseException as exc:  # noqa: BLE001  (our own code failed: the call's error, not a hang)
            call.error = exc
            self._close(call)
        finally:
            thread_raise.taken(call.ident)
            call.started.set()

    @staticmethod
    def _begin(call: _Call) -> bool:
        """Bind this thread to a working copy of the env's generators and note the host's
        process state; whether the call is to run (not given up before it began)."""
        if call.rng is not None:
            call.work = PrivateGenerators(global_rng_state() if call.rng.state is None else call.rng.state)
            bind_generators(call.work)  # this helper thread's global RNG functions draw from it alone
        with call.guard:
            if call.closed:  # given up before it began (the caller was interrupted)
                return False
            BASELINE.enter()
            call.entered = True
            call.started.set()
        return True

    @staticmethod
    def _end(call: _Call) -> None:
        """Put back what the call held (under ``call.guard``, once)."""
        call.closed = True
        if call.work is not None and not call.given_up:
            call.rng.generators = call.work  # what the call left, even when it raised
        GLOBAL_RNG_LOCK.release_for(call.ident)  # held by an import inside the call (process_state_kept)
        if call.entered:
            call.changed = BASELINE.leave()

    def _close(self, call: _Call) -> None:
        """The call returned: end it, unless the caller gave it up first."""
        with call.guard:
            if call.closed:
                return
            self._end(call)
            call.done.set()

    def _give_up(self, call: _Call, helper: threading.Thread) -> bool:
        """End a call that has not returned, from the caller; whether it was still running."""
        with call.guard:  # held while raising: the helper cannot end (and its ident be reused) meanwhile
            if call.closed:
                return False
            call.given_up = True
            self._end(call)
            call.started.set()
            if call.entered:  # not one that has not begun: it finds the call closed and lets go
                thread_raise.raise_in(helper, CallGivenUp)
        return True

    def _report(self, call: _Call, where: str) -> None:
        new = [name for name in getattr(call, "changed", ()) if name not in self._reported]
        if new:
            self._reported.update(new)
            _log.warning("%s: process state changed during %s's %s, put back: %s", where, self.subject, call.what,
                         ", ".join(new))

    # -- replies ---------------------------------------------------------------------
    def observation(self, messages: Any) -> tuple[list[Message], bool]:
        """``(messages, cut)``: the foreign observation as fresh :class:`Message` s, every text
        cleaned and the whole bounded (module docstring); ``cut`` when anything was left out.

        Raises:
            ForeignReplyError: not a list (or tuple) of :class:`Message` s.
        """
        if not isinstance(messages, (list, tuple)):
            raise ForeignReplyError(f"an observation must be a list of Messages, got {shown(messages)}")
        items = list(messages)
        for index, message in enumerate(items):
            if not isinstance(message, Message) or not isinstance(message.content, str):
                raise ForeignReplyError(f"observation item {index} is {shown(message)}, not a Message")
        self.fingerprint = observation_fingerprint(items)
        omitted = max(len(items) - MAX_OBSERVATION_MESSAGES, 0)
        if omitted:
            items = items[: MAX_OBSERVATION_MESSAGES - 1] + items[-1:]
        texts = [clean_text(str.__str__(m.content)) for m in items]
        total = sum(len(text) for text in texts)
        out, cut = [], bool(omitted)
        for index, (message, text) in enumerate(zip(items, texts)):
            share = len(text)
            if total > self.max_observation_chars:
                share = max(self.max_observation_chars * share // total, min(share, MIN_MESSAGE_CHARS))
            if len(text) > share:
                text, cut = cap_text(text, max(share, 2 * len(TRUNCATION_NOTE)), TRUNCATION_NOTE), True
            if omitted and index == len(items) - 2:
                text += OMITTED_NOTE.format(omitted=omitted)
            out.append(Message(message.role, text, _field(message.name), _field(message.tool_call_id)))
        return out, cut

    def reset_reply(self, reply: Any) -> tuple[list[Message], dict[str, Any]]:
        """``(observation, info)`` of a foreign reset, checked and bounded.

        Raises:
            ForeignReplyError: not an ``(observation, info)`` pair, or either part outside the contract.
        """
        if not isinstance(reply, tuple) or len(reply) != 2:
            raise ForeignReplyError(f"a reset must return (observation, info), got {shown(reply)}")
        obs, cut = self.observation(reply[0])
        info = self._info(reply[1], cut)
        if "tools" in info:
            info["tools"] = self._tools(info["tools"])
        return obs, info

    def step_reply(self, reply: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """``(observation, reward, terminated, truncated, info)`` of a foreign step, checked
        and bounded: flags only ``True``/``False``, the reward only a finite real number.

        Raises:
            ForeignReplyError: naming the first value outside the contract.
        """
        if not isinstance(reply, tuple) or len(reply) != 5:
            raise ForeignReplyError(f"a step must return (observation, reward, terminated, truncated, info), "
                                    f"got {shown(reply)}")
        raw_obs, reward, terminated, truncated, raw_info = reply
        flags = _flag("terminated", terminated), _flag("truncated", truncated)
        reward = _reward(reward)
        obs, cut = self.observation(raw_obs)
        return obs, reward, flags[0], flags[1], self._info(raw_info, cut)

    @staticmethod
    def error_turn(exc: BaseException) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """The turn of a step that failed: a readable observation, reward 0, truncated."""
        detail = error_text(exc)
        obs = [Message("user", f"The environment could not process that action ({detail}).")]
        return obs, 0.0, False, True, {"env_error": detail}

    def _info(self, info: Any, cut: bool) -> dict[str, Any]:
        if info is None:
            info = {}
        if not isinstance(info, Mapping):
            raise ForeignReplyError(f"info must be a dict, got {shown(info)}")
        try:
            size = len(json.dumps(info, skipkeys=True, default=lambda value: type(value).__name__))
        except (ValueError, TypeError, RecursionError) as exc:  # a reference cycle, keys that are not strings...
            raise ForeignReplyError(f"info cannot be written as JSON ({error_text(exc)})") from None
        if size > MAX_INFO_CHARS:
            raise ForeignReplyError(f"info is {size} characters of JSON, over {MAX_INFO_CHARS}")
        info = dict(info)
        if "env_error" in info:
            error = info["env_error"]
            info["env_error"] = clean_text(str(error)[:MAX_ERROR_CHARS]) if isinstance(error, str) else shown(error)
        if cut:
            info["obs_truncated"] = True
        return info

    def _tools(self, tools: Any) -> list:
        """Tool specs a reset offers (they reach the chat template): JSON-like, bounded, cleaned."""
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
            raise ForeignReplyError(f"info['tools'] must be a list of tool specs (dicts), got {shown(tools)}")
        try:
            text = json.dumps(list(tools), default=str)
        except (ValueError, TypeError, RecursionError) as exc:
            raise ForeignReplyError(f"info['tools'] cannot be written as JSON ({error_text(exc)})") from None
        if len(text) > self.max_observation_chars:
            raise ForeignReplyError(f"info['tools'] is {len(text)} characters of JSON, over max_observation_chars="
                                    f"{self.max_observation_chars}")
        try:
            return clean_value(loads_bounded(text))
        except JSONRefused as exc:
            raise ForeignReplyError(f"info['tools'] {exc}") from None


def observation_fingerprint(messages: list[Message]) -> str:
    """A digest of a whole observation, before any cut: every message's role and full text
    (a difference in the middle of a long observation changes it)."""
    digest = hashlib.blake2b(digest_size=12)
    for message in messages:
        digest.update(repr((message.role, len(message.content))).encode())
        digest.update(str.__str__(message.content).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def _field(value: str | None) -> str | None:
    return None if value is None else cap_text(str(value), MAX_FIELD_CHARS)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ForeignReplyError(f"the env returned {name}={shown(value)}; a flag must be True or False")


def _reward(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ForeignReplyError(f"the env returned reward={shown(value)}; a reward must be a real number")
    try:
        reward = float(value)
    except (OverflowError, ValueError):  # an int of 10**400
        reward = math.inf
    if not math.isfinite(reward) or abs(reward) > MAX_ABS_REWARD:
        raise ForeignReplyError(f"the env returned reward={shown(value)}; a reward must be finite and within "
                                f"+-{MAX_ABS_REWARD:g} (larger ones overflow group normalisation)")
    return reward

