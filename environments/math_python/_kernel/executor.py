"""The executor: the model's interpreter, the one process of a kernel that runs its cells.

A child of the supervisor, bounded before it runs any model code: stdin is
``/dev/null``, the OOM killer takes it first, rlimits (:mod:`.rlimits`), its own uid
without capabilities or groups (where the host is root), a parent-death signal,
``no_new_privs`` and, last, the seccomp filter (:mod:`.seccomp`). Its fds 1 and 2 and
its request/result pipes lead to the supervisor, never to the host. Per cell it says
``begin`` (after flushing what background threads printed), waits for ``go``, runs the
cell and says ``done``; nothing it says is trusted.
"""

import io
import os
import random
import signal
import sys

from .channel import clean, read_frame, ready, write_frame
from .libc import PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, prctl
from .rlimits import set_oom_score_adj, set_rlimits
from .seccomp import install_seccomp

#: the executor's exit code when its pipes to the supervisor are gone (a cell closed them)
CHANNEL_LOST = 121


def _run_cell(code, filename, namespace):
    """Execute ``code``; return (error text or None, exception name or None)."""
    import ast
    import linecache
    import traceback

    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return None, None
    except BaseException as exc:  # the cell's error is data for the model, including SystemExit
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # hide the sandbox's own frames
        try:
            if isinstance(exc, SyntaxError):
                text = "".join(traceback.format_exception_only(type(exc), exc))
            else:
                text = "".join(traceback.format_exception(type(exc), exc, tb))
        except BaseException as fmt_exc:  # an exception whose __str__ raises
            text = f"{type(exc).__name__} (its message could not be formatted: {type(fmt_exc).__name__})\n"
        return text, type(exc).__name__


def executor(req, res, limits, uid, workdir, env, namespace, report, sandbox):
    """The model's interpreter: fds 1/2 go to the supervisor; ``req``/``res`` are its pipes.
    ``sandbox``: ``seccomp`` (install the filter) and ``refuse_sysv_ipc`` (no bounded
    private IPC namespace: the filter refuses SysV IPC too)."""
    own = os.getpid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # the supervisor is the last choice of the OOM killer; the cell's processes the first
    report["oom_score_adj"] = 1000 if set_oom_score_adj(1000) else "not set (/proc refused)"
    set_rlimits(limits, report)
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        report["user"] = f"uid {uid} (own uid, no capabilities)"
    else:
        report["user"] = f"same uid as the host ({os.geteuid()}): file permissions of the host user apply"
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
    try:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        report["no_new_privs"] = True
    except OSError as exc:
        report["no_new_privs"] = f"not set ({exc})"
    if sandbox["seccomp"] is True:
        try:  # last: everything above may use what it refuses
            report["seccomp"] = "refuses " + install_seccomp(sandbox["refuse_sysv_ipc"])
        except OSError as exc:  # it worked in the zygote's probe: fail closed
            write_frame(res, {"op": "ready", "error": f"the seccomp filter could not be installed ({exc})"})
            os._exit(1)
    else:
        report["seccomp"] = f"NOT active ({sandbox['seccomp']})"
    os.environ.clear()
    os.environ.update(env, HOME=workdir, TMPDIR=workdir)
    os.chdir(workdir)
    os.umask(0o077)
    if limits.get("seed") is not None:  # seeded at fork: no start round trip
        _seed(limits["seed"])
    write_frame(res, {"op": "ready", "protections": report})
    stdout, stderr = _streams()
    cells = 0
    while True:
        msg = _next_request(req, lambda: _flush((sys.stdout, sys.stderr, stdout, stderr)))
        if msg.get("op") == "start":
            _seed(msg["seed"])
            _tell(res, {"op": "started"})
            continue
        cells += 1
        if stdout.closed or stderr.closed:  # a cell closed them: later cells still print
            stdout, stderr = _streams()
        _flush((sys.stdout, sys.stderr, stdout, stderr))  # what background threads printed so far
        _tell(res, {"op": "begin", "id": msg["id"]})
        if _next_request(req, lambda: None).get("op") != "go":  # the supervisor has drained the pipes
            os._exit(CHANNEL_LOST)
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, io.StringIO()
        error, error_name = _run_cell(msg["code"], f"<cell {cells}>", namespace)
        _flush((sys.stdout, sys.stderr, stdout, stderr))
        if os.getpid() != own:  # a process the cell forked never speaks the protocol
            os._exit(0)
        _tell(res, {"op": "done", "id": msg["id"], "status": "ok" if error is None else "error",
                    "error": clean(error, limits["output_bytes"]), "error_name": clean(error_name, 200)})


def _seed(seed):
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % (1 << 32))


def _tell(res, obj):
    try:
        write_frame(res, obj)
    except (OSError, ValueError):  # a cell closed or replaced the descriptor
        os._exit(CHANNEL_LOST)


def _streams():
    """Text streams on fds 1 and 2 (never closing the descriptors)."""
    stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                              write_through=True)
    return stdout, stderr


def _flush(streams):
    for stream in streams:
        try:
            stream.flush()
        except BaseException:  # a closed or replaced stream must not end the kernel
            pass


def _next_request(req, flush):
    """The supervisor's next request; meanwhile, output of background threads is flushed
    every 0.1 s so that it reaches the supervisor as between-cell output."""
    try:
        while not ready([req], [], 0.1)[0]:
            flush()
        return read_frame(req)
    except (EOFError, OSError, ValueError):  # the supervisor is gone, or a cell broke the pipe
        os._exit(CHANNEL_LOST)
