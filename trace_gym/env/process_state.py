"""The process state that foreign code can change, and how it is put back.

An ecosystem's env runs in our process (:mod:`trace_gym.env.adapter`), so its code can
change what every other part of the process relies on: the working directory, the
environment variables, the recursion limit, the root logger, ``sys.stdout``... Each such
thing is one :class:`StateItem` of :data:`STATE_ITEMS` (a table: one capture and one
restore per item, each runnable alone), and:

* :data:`BASELINE` holds the state as the host had it while foreign calls run: taken when
  the first of them begins, put back (the items that differ) as each one ends. Calls of
  several envs may overlap (the agent loop steps envs on a thread pool), so a call never
  restores a state that another call had already changed: the baseline is the host's.
  What one env changes during its call is also seen by the others until that call ends;
  a change the host itself makes while a foreign call runs is undone too.
* the process-global ``random`` / ``numpy.random`` states are not in the table: an env
  that draws from them gets generators of its own (:class:`PrivateGenerators`), bound to
  the thread that runs its call (:func:`bind_generators`: the global functions are made
  per thread once, :func:`install_per_thread_generators`), so envs on other threads and
  the process itself never see its draws, and no lock is held across a foreign call: a
  hung env holds up no other. :data:`GLOBAL_RNG_LOCK` only serialises code outside the
  boundary (:func:`global_rng`); the boundary breaks it for a call it gave up on, and it is
  reentrant for the thread that holds it.
* :func:`process_state_kept` wraps code outside a boundary call (imports of ecosystem
  packages, building an env on the main thread): the RNGs and every item as they were.

Signal handlers are restored only on the main thread; foreign calls run on helper threads,
where Python refuses ``signal.signal`` anyway. Not in the table (a worker process would
isolate them): ``sys.path`` and ``sys.modules`` (an env's later imports may need what it
added), monkeypatched functions, ``os.putenv`` behind ``os.environ``'s back, and anything
done in C.
"""

from __future__ import annotations

import contextlib
import gc
import locale
import logging
import os
import random
import resource
import signal
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StateItem:
    """One piece of process state: ``capture()`` returns a value comparable with ``==``;
    ``restore(value)`` puts that value back."""

    name: str
    capture: Callable[[], Any]
    restore: Callable[[Any], None]


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the directory was removed under us
        return None


def _set_cwd(path: str | None) -> None:
    if path is not None:
        os.chdir(path)


# as bytes where the platform has them: a third of the cost of decoding every variable
_ENVIRON = os.environb if os.supports_bytes_environ else os.environ
_TZ = b"TZ" if os.supports_bytes_environ else "TZ"


def _set_environ(saved: dict) -> None:
    now = dict(_ENVIRON)
    for key in now.keys() - saved.keys():
        del _ENVIRON[key]
    for key, value in saved.items():
        if now.get(key) != value:
            _ENVIRON[key] = value
    if now.get(_TZ) != saved.get(_TZ):
        time.tzset()


def _logging() -> tuple:
    root = logging.getLogger()
    return tuple(root.handlers), root.level, logging.root.manager.disable


def _set_logging(saved: tuple) -> None:
    handlers, level, disabled = saved
    root = logging.getLogger()
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = list(handlers)
    root.setLevel(level)
    logging.disable(disabled)


def _set_streams(saved: tuple) -> None:
    sys.stdin, sys.stdout, sys.stderr = saved


def _set_warnings(saved: list) -> None:
    warnings.filters[:] = saved
    warnings._filters_mutated()  # the module's own cache of the filters


def _hooks() -> tuple:
    return sys.excepthook, sys.unraisablehook, sys.displayhook, threading.excepthook


def _set_hooks(saved: tuple) -> None:
    sys.excepthook, sys.unraisablehook, sys.displayhook, threading.excepthook = saved


def _gc() -> tuple:
    return gc.isenabled(), gc.get_threshold()


def _set_gc(saved: tuple) -> None:
    enabled, threshold = saved
    gc.set_threshold(*threshold)
    (gc.enable if enabled else gc.disable)()


def _umask() -> int | None:
    """The umask, read from ``/proc`` (``os.umask`` can only read it by changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return None


def _set_umask(mask: int | None) -> None:
    if mask is not None:
        os.umask(mask)


_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)


def _timers() -> tuple[bool, ...]:
    """Which interval timers are armed (a timer that fires kills a process without a handler)."""
    return tuple(signal.getitimer(which)[0] > 0 for which in _TIMERS)


def _set_timers(saved: tuple[bool, ...]) -> None:
    for which, armed, now in zip(_TIMERS, saved, _timers()):
        if now and not armed:
            signal.setitimer(which, 0)


_LIMITS = tuple(getattr(resource, name) for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_FSIZE",
                                                      "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK", "RLIMIT_CORE")
                if hasattr(resource, name))


def _limits() -> tuple:
    return tuple(resource.getrlimit(which) for which in _LIMITS)


def _set_limits(saved: tuple) -> None:
    for which, limit in zip(_LIMITS, saved):
        if resource.getrlimit(which) != limit:
            resource.setrlimit(which, limit)  # a lowered hard limit cannot be raised: that raises, and is logged


def _signals() -> dict[int, Any] | None:
    """The Python-level handlers, read on the main thread only (elsewhere they cannot be
    set, so the boundary's helper threads skip them)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    handlers = {}
    for signum in signal.valid_signals():
        try:
            handlers[signum] = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
    return handlers


def _set_signals(saved: dict[int, Any] | None) -> None:
    if saved is None or threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set them (and only it can have changed them)
    for signum, handler in saved.items():
        if handler is not None and signal.getsignal(signum) != handler:
            signal.signal(signum, handler)


#: Everything put back after a foreign call, one item each (module docstring).
STATE_ITEMS: tuple[StateItem, ...] = (
    StateItem("cwd", _cwd, _set_cwd),
    StateItem("environment variables", lambda: dict(_ENVIRON), _set_environ),
    StateItem("recursion limit", sys.getrecursionlimit, sys.setrecursionlimit),
    StateItem("int digits limit", sys.get_int_max_str_digits, sys.set_int_max_str_digits),
    StateItem("switch interval", sys.getswitchinterval, sys.setswitchinterval),
    StateItem("root logger", _logging, _set_logging),
    StateItem("std streams", lambda: (sys.stdin, sys.stdout, sys.stderr), _set_streams),
    StateItem("warnings filters", lambda: list(warnings.filters), _set_warnings),
    StateItem("hooks", _hooks, _set_hooks),
    StateItem("gc", _gc, _set_gc),
    StateItem("socket timeout", socket.getdefaulttimeout, socket.setdefaulttimeout),
    StateItem("umask", _umask, _set_umask),
    StateItem("locale", lambda: locale.setlocale(locale.LC_ALL), lambda saved: locale.setlocale(locale.LC_ALL, saved)),
    StateItem("interval timers", _timers, _set_timers),
    StateItem("resource limits", _limits, _set_limits),
    StateItem("signal handlers", _signals, _set_signals),
)


def capture() -> dict[str, Any]:
    """Every item of :data:`STATE_ITEMS` as it is now (an item that cannot be read is left out)."""
    state = {}
    for item in STATE_ITEMS:
        try:
            state[item.name] = item.capture()
        except Exception as exc:  # noqa: BLE001  (an item this platform cannot read is not restored)
            _log.debug("process state %s not readable: %s", item.name, exc)
    return state


def restore(saved: dict[str, Any]) -> list[str]:
    """Put back every item whose value differs from ``saved``; returns their names. An item
    that cannot be put back (a hard limit lowered for good) is logged, and the others still are."""
    changed = []
    for item in STATE_ITEMS:
        if item.name not in saved:
            continue
        try:
            if item.capture() != saved[item.name]:
                item.restore(saved[item.name])
                changed.append(item.name)
        except Exception as exc:  # noqa: BLE001  (the others are still put back)
            _log.warning("could not put back the process's %s after foreign code changed it: %s", item.name, exc)
    return changed


class _Baseline:
    """The host's process state while foreign calls run (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._saved: dict[str, Any] | None = None

    def enter(self) -> None:
        with self._lock:
            if self._running == 0:
                self._saved = capture()
            self._running += 1

    def leave(self) -> list[str]:
        """One call ended: the items it (or another running call) changed, put back."""
        with self._lock:
            self._running -= 1
            changed = restore(self._saved or {})
            if self._running == 0:
                self._saved = None
            return changed


BASELINE = _Baseline()


class StateLock:
    """A reentrant lock that another thread may break (:meth:`release_for`): the boundary
    releases it on behalf of a foreign call it gave up on, which may never return."""

    def __init__(self) -> None:
        self._held = threading.Lock()
        self._meta = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._meta:
            if self._owner == me:
                self._depth += 1
                return
        self._held.acquire()
        with self._meta:
            self._owner, self._depth = me, 1

    def release(self) -> None:
        """One level of this thread's hold; nothing when the hold was broken meanwhile."""
        me = threading.get_ident()
        with self._meta:
            if self._owner != me:
                return
            self._depth -= 1
            if self._depth:
                return
            self._owner = None
            self._held.release()

    def release_for(self, ident: int | None) -> bool:
        """Release every level that thread ``ident`` holds; whether it held the lock."""
        with self._meta:
            if ident is None or self._owner != ident:
                return False
            self._owner, self._depth = None, 0
            self._held.release()
            return True

    def held_by_me(self) -> bool:
        return self._owner == threading.get_ident()

    def __enter__(self) -> "StateLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


#: Held around imports and code outside the boundary (:func:`process_state_kept`), never
#: across a foreign call: an env's private generators are per thread (:func:`bind_generators`).
GLOBAL_RNG_LOCK = StateLock()


# ---------------------------------------------------------------------- the global RNGs, per thread
class PrivateGenerators:
    """One env's own ``random.Random`` and ``numpy.random.RandomState``, made from a
    ``(random, numpy.random)`` state tuple: what the process-global ``random`` and
    ``numpy.random`` functions draw from on a thread bound to them (:func:`bind_generators`)."""

    def __init__(self, state: tuple):
        self.random = random.Random()
        self.random.setstate(state[0])
        self.numpy = np.random.RandomState()
        self.numpy.set_state(state[1])

    @property
    def state(self) -> tuple:
        return self.random.getstate(), self.numpy.get_state()


_GENERATORS = threading.local()  # .bound: the PrivateGenerators of the foreign call this thread runs
_INSTALL_LOCK = threading.Lock()
_NUMPY_ALIASES = {"seed": "seed", "ranf": "random_sample", "sample": "random_sample"}


def _bound() -> PrivateGenerators | None:
    return getattr(_GENERATORS, "bound", None)


class _PerThreadRandom(random.Random):
    """The class of ``random``'s hidden instance once :func:`install_per_thread_generators` ran:
    every draw, seed and state call goes to the generators bound on the calling thread, else
    to the process's own state (the methods every other one draws through)."""

    def random(self) -> float:
        own = _bound()
        return super().random() if own is None else own.random.random()

    def getrandbits(self, k: int) -> int:
        own = _bound()
        return super().getrandbits(k) if own is None else own.random.getrandbits(k)

    def seed(self, *args: Any, **kwargs: Any) -> None:
        own = _bound()
        return super().seed(*args, **kwargs) if own is None else own.random.seed(*args, **kwargs)

    def getstate(self) -> tuple:
        own = _bound()
        return super().getstate() if own is None else own.random.getstate()

    def setstate(self, state: tuple) -> None:
        own = _bound()
        return super().setstate(state) if own is None else own.random.setstate(state)

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float:  # it caches a draw on the instance
        own = _bound()
        return super().gauss(mu, sigma) if own is None else own.random.gauss(mu, sigma)


def _numpy_function(name: str) -> Any:
    """``numpy.random.<name>`` drawing from the generators bound on the calling thread, else the process's."""
    method = _NUMPY_ALIASES.get(name, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        own = _bound()
        return getattr(np.random.mtrand._rand if own is None else own.numpy, method)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(np.random, name).__doc__
    return call


def install_per_thread_generators() -> None:
    """Make the process-global ``random`` and ``numpy.random`` functions per thread: on a
    thread bound to an env's :class:`PrivateGenerators` they draw from those, elsewhere from
    the process's own state as before. Once per process (idempotent); ``random``'s hidden
    instance gets :class:`_PerThreadRandom` as its class and the module's functions are bound
    again, and each legacy ``numpy.random`` function (a method of its hidden ``RandomState``,
    or ``seed``) is replaced by one that dispatches. A function imported by name before this
    ran (``from random import shuffle`` is bound to the instance, so it dispatches;
    ``from random import random`` and ``from numpy.random import randint`` do not) keeps
    drawing from the process's state. Costs about 1 us more per draw of the global functions."""
    with _INSTALL_LOCK:
        if type(random._inst) is _PerThreadRandom:
            return
        random._inst.__class__ = _PerThreadRandom
        for name in dir(random):
            if getattr(getattr(random, name), "__self__", None) is random._inst:
                setattr(random, name, getattr(random._inst, name))
        legacy = np.random.mtrand._rand
        for name in dir(np.random):
            if getattr(getattr(np.random, name), "__self__", None) is legacy or name in _NUMPY_ALIASES:
                setattr(np.random, name, _numpy_function(name))


def bind_generators(generators: PrivateGenerators | None) -> None:
    """Make ``generators`` what the global RNG functions draw from on this thread (``None``:
    the process's own again); :func:`install_per_thread_generators` first."""
    install_per_thread_generators()
    _GENERATORS.bound = generators


def global_rng_state() -> tuple:
    """The process-global ``(random, numpy.random)`` states."""
    return random.getstate(), np.random.get_state()


def set_global_rng(state: tuple) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])


def seeded_rng_state(seed: int) -> tuple:
    """The global states right after ``random.seed(seed)`` and ``numpy.random.seed(seed % 2**32)``,
    made without touching the globals."""
    return random.Random(seed).getstate(), np.random.RandomState(seed % 2**32).get_state()


@contextlib.contextmanager
def global_rng(state: tuple | None) -> Iterator[list]:
    """Run with the global RNGs set to ``state`` (``None``: as they are), under
    :data:`GLOBAL_RNG_LOCK`; yields a one-item list that holds, afterwards, the state they
    were left in. The process's own state is put back, unless the boundary broke the lock
    meanwhile (it put the state back itself, and another env may hold it now)."""
    with GLOBAL_RNG_LOCK:
        saved = global_rng_state()
        if state is not None:
            set_global_rng(state)
        left: list = [None]
        try:
            yield left
        finally:
            if GLOBAL_RNG_LOCK.held_by_me():
                left[0] = global_rng_state()
                set_global_rng(saved)


_THREAD = threading.local()


def bind_thread(call: Any) -> None:
    """Mark this thread as running ``call`` (an object with a ``given_up`` flag)."""
    _THREAD.call = call


def given_up() -> bool:
    """Whether this thread runs a foreign call that the boundary gave up on (it must not
    touch process state any more: the boundary put it back, and others run now)."""
    call = getattr(_THREAD, "call", None)
    return call is not None and bool(call.given_up)


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """The global RNGs and every item of :data:`STATE_ITEMS` as they were before. Wrap each
    import of an ecosystem package and each foreign call made outside the boundary."""
    with global_rng(None):
        saved = capture()
        try:
            yield
        finally:
            if not given_up():
                restore(saved)
