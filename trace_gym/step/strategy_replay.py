"""A strategy's calls replayed in a fresh process: were its answers a function of what it was
given and its rng?

The bench records every call of each arm's strategy in its first repetition
(:class:`~trace_gym.step.strategy_boundary.CallLog`: the view, the rng's state before the call,
the checked answer) and hands them, with a pristine copy of the strategy, to
:func:`replay_plays`. A fresh Python process (``python -m trace_gym.step.strategy_replay``), in
which no bank, runner, tree or predictor exists, unpickles each strategy and makes the same
calls with the same views and rng states, through the same boundary. A strategy whose
answers differ read something besides its inputs and its rng (a global random generator
seeded elsewhere, the clock, the call stack or the garbage collector leading to recorded
outcomes it had not paid for); it gets no verdict, with one line naming the first call that
differed. A strategy that cannot be pickled cannot be replayed, and gets no verdict either
(write it as a module-level class).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any, Mapping

import numpy as np

#: Seconds the replay process may take for all arms together.
REPLAY_TIMEOUT_S = 300.0


def replay_plays(plays: Mapping[str, Any], timeout_s: float = REPLAY_TIMEOUT_S) -> dict[str, str]:
    """Replay each :class:`~trace_gym.step.strategy_boundary.StrategyPlay` (recorded, with a
    pristine strategy) in a fresh process; ``{arm: why it gets no verdict}`` for each arm whose
    replay differed, failed or could not run (arms that replayed alike are absent)."""
    failed: dict[str, str] = {}
    jobs = {}
    for name, play in plays.items():
        try:
            jobs[name] = (pickle.dumps(play.pristine), play.boundary.log.calls, play.boundary.timeout_s)
        except Exception as exc:  # noqa: BLE001  (whatever pickling a user's object raises)
            failed[name] = (f"strategy {name!r} cannot be pickled ({type(exc).__name__}: {str(exc)[:120]}), so its "
                            "calls cannot be replayed outside the bench to check that they depend only on what it "
                            "was given and its rng; write it as a module-level class")
    if not jobs:
        return failed
    payload = pickle.dumps({"path": list(sys.path), "jobs": jobs})
    try:
        proc = subprocess.run([sys.executable, "-m", "trace_gym.step.strategy_replay"], input=payload,
                              capture_output=True, timeout=timeout_s)
        lines = proc.stdout.decode("utf-8", "replace").splitlines()
    except subprocess.TimeoutExpired as exc:
        lines = (exc.stdout or b"").decode("utf-8", "replace").splitlines()
    done = {}
    for line in lines:
        try:
            record = json.loads(line)
            done[record["arm"]] = record["problem"]
        except (ValueError, KeyError, TypeError):
            continue
    for name in jobs:
        if name not in done:
            failed[name] = (f"strategy {name!r}: its replay outside the bench did not finish within {timeout_s:g} s "
                            "(all arms together), so its answers could not be checked")
        elif done[name]:
            failed[name] = done[name]
    return failed


def _replay_one(name: str, blob: bytes, calls: list, timeout_s: float) -> str | None:
    """Why ``name``'s replay differs (one line), or ``None`` when every answer was the same."""
    from trace_gym.step.strategy_boundary import StrategyBoundary, StrategyViolation

    strategy = pickle.loads(blob)
    boundary = StrategyBoundary(name, timeout_s)
    for n, (kind, args, state, asked) in enumerate(calls):
        rng = np.random.Generator(getattr(np.random, state["bit_generator"])())
        rng.bit_generator.state = state
        fn = strategy.plan if kind == "plan" else strategy.plan_prompt
        try:
            again = boundary.plan(fn, args[0], rng, candidate=args[1] if kind != "plan" else None)
        except StrategyViolation as exc:
            return f"{exc} (when its calls were replayed outside the bench)"
        if again != asked:
            view = args[0]
            return (f"strategy {name!r} answered otherwise when its calls were replayed outside the bench (call "
                    f"{n + 1}, {kind} of step {view.step} wave {view.wave}: {_short(asked)} in the bench, "
                    f"{_short(again)} replayed): its choices depend on something besides what it was given and "
                    "its rng")
    return None


def _short(asked: Any) -> str:
    text = f"roots {asked.roots}, continuations {asked.continuations}, reserve {asked.reserve}"
    return text if len(text) <= 160 else text[:157] + "..."


def main() -> None:
    """The replay process: read the jobs (pickled) on stdin, print one JSON line per arm."""
    data = pickle.loads(sys.stdin.buffer.read())
    for entry in data["path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    for name, (blob, calls, timeout_s) in data["jobs"].items():
        try:
            problem = _replay_one(name, blob, calls, timeout_s)
        except BaseException as exc:  # noqa: BLE001  (a strategy that exits or fails to unpickle: named)
            problem = f"strategy {name!r}: its replay outside the bench failed ({type(exc).__name__}: {str(exc)[:160]})"
        print(json.dumps({"arm": name, "problem": problem}), flush=True)


if __name__ == "__main__":
    main()
