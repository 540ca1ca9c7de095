"""Rebuilding MathPython's interpreter after a restore: the kernel seeds and the replay.

A ``replay`` snapshot of :class:`~environments.math_python.env.MathPythonEnv` records the
cells run in the live interpreter with their status. :func:`kernel_seed` is the seed of each
interpreter of an episode (so a rebuilt one draws what the original drew);
:func:`replay_cells` re-executes the recorded cells in a fresh kernel within a time budget
and reports which diverged.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from environments.math_python.sandbox import Kernel


def kernel_seed(episode_seed: int, generation: int) -> int:
    """The seed of the ``generation``-th interpreter of an episode (restarts count up)."""
    return int(np.random.SeedSequence([int(episode_seed), int(generation)]).generate_state(1)[0])


def replay_cells(new_kernel: Callable[[], Kernel], cells: Sequence[tuple[str, str]], per_cell_s: float,
                 budget_s: float) -> tuple[Kernel | None, dict[str, Any]]:
    """Re-run ``cells`` (``(code, recorded status)`` pairs) in ``new_kernel()``, all within
    ``budget_s`` seconds and each within ``per_cell_s``; their output is discarded. A kernel
    that dies on the way is replaced by a fresh ``new_kernel()`` for the remaining cells.

    Returns ``(kernel, report)``: the rebuilt kernel, or None (that kernel closed) when the
    budget ran out or a cell that had ended now hit its limit; the report has ``cells``,
    ``replayed``, ``elapsed`` (seconds), ``diverged`` (``{"cell", "recorded", "replayed"}``
    per cell whose status changed), ``timed_out`` and ``budget_s``. Raises KernelError
    when no kernel starts."""
    kernel = new_kernel()
    deadline = time.monotonic() + budget_s
    diverged, elapsed, replayed, timed_out = [], 0.0, 0, False
    for i, (code, status) in enumerate(cells):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        result = kernel.execute(code, timeout=min(per_cell_s, left))
        elapsed += result.elapsed
        replayed += 1
        if result.timed_out:  # the recorded cell ended; here it did not: the state cannot be rebuilt in time
            diverged.append({"cell": i, "recorded": status, "replayed": result.status})
            timed_out = True
            break
        if result.status != status:
            diverged.append({"cell": i, "recorded": status, "replayed": result.status})
        if not result.kernel_alive:  # cannot rebuild the rest; carry on in a fresh one
            kernel = new_kernel()
    report = {"cells": len(cells), "replayed": replayed, "elapsed": elapsed,
              "diverged": diverged, "timed_out": timed_out, "budget_s": budget_s}
    if timed_out:
        kernel.close()
        return None, report
    return kernel, report
