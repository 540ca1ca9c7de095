"""Raising an exception in another thread, and taking it back when that thread never takes it.

The boundary (:mod:`trace_gym.env.boundary`) stops a foreign call it gave up on by sending
an exception to the call's helper thread (CPython's ``PyThreadState_SetAsyncExc``): a
pure-Python loop stops at its next instruction. A thread blocked in C (``time.sleep(1e6)``,
a socket read) runs no instruction, so the exception stays pending; and while any exception
is pending, CPython 3.11 keeps an interpreter-wide flag set that every thread checks: from
then on every line run under ``sys.settrace`` (a debugger, coverage, a profiler) spins for
ever, and every other line pays for the check. :func:`withdraw` takes the exception back
and clears that flag, the only way CPython offers: by raising one exception of ours in the
calling thread, and catching it.
"""

from __future__ import annotations

import ctypes
import threading

# two prototypes of one C function: an exception to send, and NULL (drop the pending one)
_send = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_drop = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))

_LOCK = threading.Lock()
_PENDING: dict[int, type[BaseException]] = {}  # thread ident -> the exception sent to it, not yet withdrawn
#: Instructions the caller runs while its own exception is delivered (CPython delivers it at
#: the next check of its eval breaker: a call's return, a backward jump).
_DELIVERY_LOOPS = 1000


class _Withdrawn(BaseException):
    """Raised in the calling thread by :func:`withdraw`, and caught there (never escapes)."""


def raise_in(thread: threading.Thread, exc_type: type[BaseException]) -> None:
    """Raise ``exc_type`` in ``thread`` at its next Python instruction."""
    ident = thread.ident
    if ident is None:
        return
    with _LOCK:
        if _send(ident, exc_type) == 1:
            _PENDING[ident] = exc_type


def taken(thread_ident: int) -> None:
    """The thread ``thread_ident`` took the exception sent to it (call from that thread)."""
    with _LOCK:
        _PENDING.pop(thread_ident, None)


def withdraw(thread: threading.Thread) -> None:
    """Take back the exception sent to ``thread`` (still blocked in C), and clear CPython's
    pending flag (module docstring); exceptions still pending for other threads are sent again,
    so they are still delivered."""
    ident = thread.ident
    with _LOCK:
        if ident is None or _PENDING.pop(ident, None) is None:
            return
        _drop(ident, None)  # the thread's pending exception is dropped
        own = threading.get_ident()
        try:
            _send(own, _Withdrawn)
            for _ in range(_DELIVERY_LOOPS):
                pass
        except _Withdrawn:
            pass
        else:  # not delivered here (another interpreter's rules): never let it out later
            _drop(own, None)
        for other, exc_type in _PENDING.items():
            _send(other, exc_type)
