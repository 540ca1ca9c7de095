"""reasoning-gym's scorers, run on model text inside the math env's sandbox.

Several reasoning-gym scorers evaluate the answer text as code: ``eval`` in
``spiral_matrix``, ``binary_matrix``, ``n_queens``, ``string_insertion``; sympy's
``sympify``/``parse_expr`` (``eval`` underneath) in ``countdown``, ``puzzle24``, the
integration and polynomial datasets; and a sympy call on ``1e999999`` runs for tens of
seconds with no way to interrupt it in-process. So the adapter never scores in its own
process. Each score runs in a forked child of a sandboxed kernel
(:mod:`environments.math_python.sandbox`: its own network, pid, IPC and mount namespaces,
a read-only root without the project, a memory cgroup, a seccomp filter, rlimits), and:

* **host safety**: whatever the answer runs, it runs there, with no network, no project
  files, bounded memory and processes; a child past ``timeout_s`` seconds of *CPU time*
  (``RLIMIT_CPU``, rounded up to whole seconds) is killed and the answer scores 0
  (``info["env_error"]`` says why); a kernel that dies is replaced. CPU time, not wall
  clock, so that a score does not depend on how busy the machine is (a wall-clock limit
  made the same answer's outcome a function of the load); a child that waits without
  using CPU is killed after 3 ``timeout_s`` + 5 s of wall clock.
* **no state between scores**: the child is forked per score and exits, so an answer
  cannot patch the scorer for later answers; its stdout/stderr go to ``/dev/null`` and
  the score comes back on a pipe the kernel reads, so printed text cannot pose as one;
  the kernel makes itself non-dumpable, so the child cannot ptrace it.
* **no code in answers to evaluating scorers** (checked by the adapter, host-side, before
  a score is asked for): for a dataset whose module evaluates text (found by reading its
  source for ``eval(``, ``exec(``, ``sympify``, ``parse_expr``: :func:`evaluates_text`),
  the answer must fit its dataset's allow-list grammar
  (:mod:`environments.ecosystems.answer_grammar`: literals only by default, integer
  arithmetic over the puzzle's numbers for ``countdown``/``puzzle24``, elementary sympy
  expressions for the integration and polynomial datasets), or it scores 0 unscored: an
  evaluated answer could otherwise compute its score (``Integral(...)``) or read the gold
  answer from the scorer's frame. :data:`CODE_NAMES`, a deny-list of dunders and names
  that reach frames, builtins or the import system, is checked first, as a second line.

Costs: the first score of a process starts a kernel and imports reasoning-gym in it
(about 1-2 s); each score then forks (a few ms).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import threading
from typing import Any

#: CPU seconds one score may take before its child is killed (answer scores 0)
DEFAULT_TIMEOUT_S = 5.0
#: what in a dataset module's source means its scorer may evaluate answer text
EVALUATES = re.compile(r"\beval\(|\bexec\(|\bsympify\b|\bparse_expr\b")
#: identifiers an answer to an evaluating scorer may not hold (frames, builtins, imports)
CODE_NAMES = re.compile(
    r"__|\b(?:eval|exec|compile|open|getattr|setattr|delattr|globals|locals|vars|dir|breakpoint|input|help|"
    r"memoryview|type|object|super|classmethod|staticmethod|property|exit|quit|lambda|import|"
    r"f_back|f_locals|f_globals|f_code|f_builtins|gi_frame|gi_code|cr_frame|ag_frame|tb_frame|tb_next|co_\w+|"
    r"func_globals|sys|os|subprocess|builtins|mro|subclasses)\b")

#: the kernel side: defines ``_trace_gym_score`` (``from_json`` comes from :mod:`.entry_json`, :func:`_setup_cell`); a score forks a child per call
_SETUP = r'''
import ctypes as _ctypes, json as _json, math as _math, os as _os, resource as _resource, select as _select
import signal as _signal, time as _time
_os.environ["MPLCONFIGDIR"] = _os.getcwd()
_ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the scoring child cannot ptrace this process
import reasoning_gym as _rg
_DATA = {}

def _trace_gym_score(request):
    name, config, answer, entry, timeout = _json.loads(request)
    key = (name, _json.dumps(config, sort_keys=True))
    if key not in _DATA:
        _DATA[key] = _rg.create_dataset(name, seed=0, size=1, **config)
    data, entry = _DATA[key], from_json(entry)
    read, write = _os.pipe()
    pid = _os.fork()
    if pid == 0:  # the child: scores once, reports on the pipe, exits
        try:
            cpu = max(1, _math.ceil(timeout))  # CPU seconds: what the machine's load cannot change
            _resource.setrlimit(_resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu s, SIGKILL 1 s later
            _os.close(read)
            null = _os.open(_os.devnull, _os.O_WRONLY)
            _os.dup2(null, 1)
            _os.dup2(null, 2)
            score = data.score_answer(answer, entry)
            out = {"score": score if isinstance(score, (int, float)) and not isinstance(score, bool) else repr(score)[:200]}
        except BaseException as exc:
            out = {"error": (type(exc).__name__ + ": " + str(exc))[:500]}
        try:
            _os.write(write, _json.dumps(out).encode()[:65536])
        finally:
            _os._exit(0)
    _os.close(write)
    deadline, chunks = _time.monotonic() + 3 * timeout + 5, []  # wall clock: only for a child that waits
    while True:
        left = deadline - _time.monotonic()
        if left <= 0 or not _select.select([read], [], [], left)[0]:
            _os.kill(pid, _signal.SIGKILL)
            result = {"error": "the scorer ran past %g s of wall clock without finishing" % (3 * timeout + 5)}
            chunks = None  # killed here, not by its CPU limit
            break
        chunk = _os.read(read, 65536)
        if not chunk:
            try:
                result = _json.loads(b"".join(chunks) or b"null") or {"error": "the scorer process died"}
            except ValueError:
                result = {"error": "the scorer process wrote no score"}
            break
        chunks.append(chunk)
    _os.close(read)
    _, status = _os.waitpid(pid, 0)
    if chunks == [] and _os.WIFSIGNALED(status):  # died before it wrote: its CPU limit, or another signal
        result = {"error": "the scorer ran past %g s of CPU time" % timeout if _os.WTERMSIG(status) == _signal.SIGXCPU
                  else "the scorer process was killed by signal %d" % _os.WTERMSIG(status)}
    print(_json.dumps(result))
'''


@functools.lru_cache(maxsize=1)
def _setup_cell() -> str:
    """:data:`_SETUP` with the adapter's own entry decoder (its source: the kernel cannot
    import the project, which its root hides)."""
    from environments.ecosystems import entry_json

    decoder = (f"from collections.abc import Mapping\nfrom typing import Any\nTUPLE_TAG, ITEMS_TAG = "
               f"{entry_json.TUPLE_TAG!r}, {entry_json.ITEMS_TAG!r}\n" + inspect.getsource(entry_json.from_json))
    return _SETUP + "\n" + decoder


@functools.lru_cache(maxsize=256)
def evaluates_text(dataset_class: type) -> bool:
    """Whether ``dataset_class``'s module may evaluate answer text (:data:`EVALUATES`)."""
    try:
        return bool(EVALUATES.search(inspect.getsource(inspect.getmodule(dataset_class))))
    except (OSError, TypeError):
        return True  # no source to read: assume the worst


class SandboxedScorer:
    """Scores reasoning-gym answers in a sandboxed kernel (see the module docstring); one
    per process, shared by every env (a lock serialises the kernel; a score takes ms).

    Args:
        timeout_s: CPU seconds one score may take (a waiting child: 3x that + 5 s of wall clock).
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._kernel: Any = None
        self._factory: Any = None

    def _ready_kernel(self) -> Any:
        from environments.math_python.sandbox import KernelFactory, KernelLimits

        if self._kernel is None or not self._kernel.alive:
            if self._factory is None:
                self._factory = KernelFactory(KernelLimits(cell_timeout_s=self.timeout_s + 60.0, cpu_time_s=3600,
                                                           memory_mb=2048, max_processes=16))
            kernel = self._factory.new_kernel(0)
            setup = kernel.execute(_setup_cell())
            if setup.status != "ok":
                kernel.close()
                raise RuntimeError(f"the scoring sandbox did not start ({setup.status}: "
                                   f"{(setup.error or setup.stderr.text())[-300:]})")
            self._kernel = kernel
        return self._kernel

    def score(self, dataset: str, config: dict, answer: str | None, entry_json: Any) -> tuple[float, str | None]:
        """``(score, None)``, or ``(0.0, why)`` when the scorer failed, timed out or was refused."""
        request = json.dumps([dataset, config, answer, entry_json, self.timeout_s])
        with self._lock:
            try:
                kernel = self._ready_kernel()
                result = kernel.execute(f"_trace_gym_score({request!r})")
            except Exception as exc:  # noqa: BLE001  (no sandbox: nothing is scored outside it)
                return 0.0, f"score_answer not run: {type(exc).__name__}: {str(exc)[:300]}"
            if result.status != "ok":
                self._kernel = None if not result.kernel_alive else self._kernel
                return 0.0, f"score_answer failed in the sandbox ({result.status}: {(result.error or '')[-200:]})"
        try:
            reply = json.loads(result.stdout.text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0.0, "score_answer gave no readable result"
        if "error" in reply:
            return 0.0, f"score_answer failed: {reply['error']}"
        score = reply.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not (-1e9 < score < 1e9):
            return 0.0, f"score_answer returned {score!r:.100}, not a finite number"
        return float(score), None

    def close(self) -> None:
        with self._lock:
            if self._kernel is not None:
                self._kernel.close()
                self._kernel = None


_SHARED: SandboxedScorer | None = None
_SHARED_LOCK = threading.Lock()


def shared_scorer() -> SandboxedScorer:
    """The process's one :class:`SandboxedScorer`."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = SandboxedScorer()
        return _SHARED
