"""Deterministic mode: a run as a function of its config and seed, whatever the machine's load.

The switch is the config key ``deterministic`` (``--deterministic true``; the
:class:`~trace_gym.config_sections.Reproducibility` section of ``train`` and every
``bench`` mode). Without it a command sizes its CPU threads to the machine's load
(:func:`trace_gym.utils.threads.apply_thread_policy`), and a different thread count changes the
order of float reductions: the same config and seed then sampled other tokens beside a
busy process than on an idle machine (``make demo``: TRACE's effective ratio 0.444 idle,
0.333 busy). :func:`enable` fixes every source of such run-to-run differences this project
owns:

- **threads**: one count for the whole process, a function of the user's word only:
  ``$TRACE_GYM_THREADS``, else ``$OMP_NUM_THREADS`` (when the user set it), else
  :data:`FIXED_THREADS` (1). It is written to ``OMP_NUM_THREADS`` (what the trainer,
  the engines and the predictor take as their default, and what child processes
  inherit), set as torch's intra-op count, and set for numpy's BLAS (through
  threadpoolctl, where it is installed). One thread by default, not the machine's
  cores: the same count on every machine, and no oversubscription beside other work
  (where two spinning threads on two shared cores generated 5 to 37 tokens/s against 114 for
  one, docs/benchmarking.md); ``TRACE_GYM_THREADS=N`` buys speed on an idle
  multi-core machine, and then the run is a function of its config, its seed and N.
- **torch**: ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic
  implementation raises instead of varying; uninitialised memory is filled), cuDNN's
  deterministic kernels without autotuning, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless
  set) for deterministic cuBLAS on a GPU.
- **the env worker pool**: an :class:`~trace_gym.agent.loop.AgentRunner` built in this mode
  waits for every env step before its next generation round (no stragglers,
  ``straggler_seconds`` = inf), so which episodes share a batch, and so every row's
  sampling seed and the order of everything after it, no longer depends on how fast an
  env step ran. A slow env step then holds up its round: that is the mode's cost there.
- **engines**: the HF engine draws each completion from its own generator seeded by
  ``(call seed, prefix index, sample index)`` (:func:`trace_gym.engines.sampling.row_seed`),
  and its padded rows compute what they would alone, so a completion is a function of the
  call's prefixes and seed; an engine declares this with ``deterministic = True``. vLLM
  seeds each request, but its batched kernels are not batch-invariant and on a GPU not all
  deterministic, and with its multiprocess engine core (the GPU default) the batches it
  forms depend on timing: :func:`engine_note` names such an engine, and the run warns.

What the mode cannot fix, and the docs say so: an env whose outcome depends on wall-clock
time (a cell that hits its time limit only under load), software or CPU kind (another
torch, MKL code path or GPU computes other floats), and actors in other processes
(``--ray``: the driver's rounds follow the mode, the actors' threads are Ray's).

The mode is process-wide (torch's switch is too): :func:`applied` holds it for one block of
work (a training run, a bench) and puts the process back after it; :func:`enable` keeps it on.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, MutableMapping

from trace_gym.utils import threads

_log = logging.getLogger(__name__)

#: CPU threads of a deterministic run when the user names no count (see the module docstring).
FIXED_THREADS = 1
#: cuBLAS's workspace setting for deterministic GEMMs (NVIDIA's documented value).
CUBLAS_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class DeterministicMode:
    """What :func:`enable` fixed: the process's CPU thread count and where it came from
    (``$TRACE_GYM_THREADS``, ``$OMP_NUM_THREADS`` or ``the fixed default``)."""

    threads: int
    source: str

    def describe(self) -> str:
        """One line for the run's output."""
        return (f"deterministic mode: {self.threads} CPU thread(s) ({self.source}; the load is not followed), torch "
                "deterministic algorithms, every env step waited for before the next generation round")


_ACTIVE: DeterministicMode | None = None
_BLAS: Any = None  # threadpoolctl's limiter: gives numpy's BLAS its count back
_HOOK: Any = None  # the import hook waiting for torch (:class:`_WhenTorchLoads`)


def fixed_threads(env: Mapping[str, str] | None = None,
                  decision: threads.ThreadDecision | None = None) -> tuple[int, str]:
    """The thread count of deterministic mode and its source: the user's
    ``$TRACE_GYM_THREADS``, else the user's ``$OMP_NUM_THREADS``, else :data:`FIXED_THREADS`.

    ``decision`` is the process budget the CLI decided at start (default:
    :func:`trace_gym.utils.threads.process_decision`); where it was measured from the load, the
    ``OMP_NUM_THREADS`` it wrote is not the user's word and is ignored.

    >>> fixed_threads({"OMP_NUM_THREADS": "3"}, None), fixed_threads({}, None)
    ((3, '$OMP_NUM_THREADS'), (1, 'the fixed default'))
    """
    env = os.environ if env is None else env
    decision = threads.process_decision() if decision is None else decision
    if decision is not None:
        if decision.source != "measured":
            return decision.threads, f"${decision.source}"
        return FIXED_THREADS, "the fixed default"
    for name in (threads.THREADS_ENV, "OMP_NUM_THREADS"):
        if (n := threads.thread_override(name, env.get(name))[0]) is not None:
            return n, f"${name}"
    return FIXED_THREADS, "the fixed default"


def _limit_blas(n: int) -> Any:
    """numpy's BLAS threads to ``n`` (threadpoolctl, where installed: numpy read its count when it
    loaded, from the load-sized ``OMP_NUM_THREADS`` of the CLI's start); returns what restores
    the previous counts, or ``None``."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional package: without it numpy keeps the count it loaded with
        _log.info("deterministic mode: threadpoolctl is not installed; numpy's BLAS keeps its thread count")
        return None
    return threadpool_limits(limits=n, user_api="blas")


def enable(env: MutableMapping[str, str] | None = None) -> DeterministicMode:
    """Put this process in deterministic mode (see the module docstring) until the process
    ends; idempotent. :func:`applied` is the same for one block of work.

    Call it before the trainer, engines and predictors are built (they read the thread
    count when they are made). torch's switches are set now where torch is loaded, else right
    after it loads: a command that never loads torch (``bench --sim``) does not pay for it.
    """
    global _ACTIVE, _BLAS, _HOOK
    if _ACTIVE is not None:
        return _ACTIVE
    env = os.environ if env is None else env
    n, source = fixed_threads(env)
    env["OMP_NUM_THREADS"] = str(n)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # read when cuBLAS starts: before any GPU GEMM
    deterministic = (n, True, False, True, False)
    if "torch" in sys.modules:
        _set_torch(deterministic)
    else:
        _HOOK = _WhenTorchLoads(deterministic)
        sys.meta_path.insert(0, _HOOK)
    _BLAS = _limit_blas(n)
    _ACTIVE = DeterministicMode(n, source)
    return _ACTIVE


def active() -> DeterministicMode | None:
    """The mode this process is in (``None``: not deterministic)."""
    return _ACTIVE


def _torch_state() -> tuple | None:
    """torch's switches now: (threads, deterministic algorithms, warn only, cuDNN deterministic,
    cuDNN benchmark); ``None`` while torch is not loaded."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark)


def _set_torch(state: tuple) -> None:
    import torch

    n, algorithms, warn_only, cudnn_deterministic, cudnn_benchmark = state
    threads.set_threads(n)
    now = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if now != (algorithms, warn_only):  # the call imports torch._inductor: ~2.4 s, even when it changes nothing
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_deterministic, cudnn_benchmark


class _WhenTorchLoads(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook that sets torch's switches (:func:`_set_torch`) once ``import torch`` has
    run: loading torch takes 7 s on the shared 2-core box, more than a whole small bench."""

    def __init__(self, state: tuple):
        self.state, self.loader = state, None

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        self.remove()  # once, and so that the search below finds torch's own spec
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _set_torch(self.state)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _process_state() -> dict[str, Any]:
    return {"env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")},
            "torch": _torch_state()}


def _restore(state: dict[str, Any]) -> None:
    global _ACTIVE, _BLAS, _HOOK
    if _HOOK is not None:
        _HOOK.remove()
    if _BLAS is not None:
        _BLAS.restore_original_limits()
    _ACTIVE = _BLAS = _HOOK = None
    for key, value in state["env"].items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if state["torch"] is not None:
        _set_torch(state["torch"])
    elif "torch" in sys.modules:  # loaded inside the block: torch's own defaults
        _set_torch((threads.default_threads(), False, False, False, False))


@contextlib.contextmanager
def applied(cfg: Any) -> Iterator[DeterministicMode | None]:
    """The body in deterministic mode when ``cfg.deterministic`` is true (a config without the
    key: never), and the process as it was after it (threads, env, torch's switches), so a
    library user's next call in the same process runs as it would have. Inside a block that
    is in the mode already, the mode simply goes on. Yields the mode, or ``None``."""
    if not getattr(cfg, "deterministic", False) or _ACTIVE is not None:
        yield _ACTIVE
        return
    before = _process_state()
    try:
        yield enable()
    finally:
        _restore(before)


def engine_note(engine: Any) -> str | None:
    """One warning line when deterministic mode is on and ``engine`` does not declare
    ``deterministic = True`` (its samples may differ between runs of one config and seed),
    else ``None`` (also for ``engine=None``: a source with no engine samples nothing).

    >>> engine_note(None) is None
    True
    """
    if _ACTIVE is None or engine is None or getattr(engine, "deterministic", False):
        return None  # no engine (a bank bench replays recorded samples): nothing to promise
    why = getattr(engine, "nondeterminism", None) or "it does not declare itself deterministic"
    return (f"WARNING: deterministic mode: the {type(engine).__name__} engine cannot promise the same samples for the "
            f"same config and seed ({why}); use engine=hf for that")
