"""A strategy is user code inside the step: each way of breaking the rules, planted, ends that
arm with one line naming it and no verdict, while the other arms keep theirs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trace_gym.bench.sim import run_sim_bench
from trace_gym.bench.config import SimBenchConfig
from trace_gym.strategies import shaped_strategies

PLANTS = textwrap.dedent('''
    """Strategies that break the step's rules, one per class (planted by the tests)."""
    import random
    import sys
    import time

    import numpy as np

    from trace_gym.api import Strategy, UniformRootAllocator, Wave


    class Fair:
        def allocate(self, values, budget, rng):
            out = np.zeros(len(values), dtype=np.int64)
            out[: budget // 4] = 4
            return out


    class Overspend:  # counts that wrap int64 when summed: [2**62] * 4 sums to 0
        def allocate(self, values, budget, rng):
            out = np.zeros(len(values), dtype=np.int64)
            out[:4] = 2 ** 62
            return out


    class Mutates(Fair):  # writes into the predictions it was given
        def allocate(self, values, budget, rng):
            values[:] = 0.5
            return super().allocate(values, budget, rng)


    class Hangs(Fair):
        def allocate(self, values, budget, rng):
            time.sleep(1e6)


    class Exits(Fair):
        def allocate(self, values, budget, rng):
            sys.exit(0)


    class GlobalRandom(Fair):  # draws from numpy's global generator, not the rng it is given
        def allocate(self, values, budget, rng):
            order = np.random.permutation(len(values))
            out = np.zeros(len(values), dtype=np.int64)
            out[order[: budget // 4]] = 4
            return out


    class PythonRandom(Fair):
        def allocate(self, values, budget, rng):
            random.random()
            return super().allocate(values, budget, rng)


    class Peeks(Fair):
        """Walks the other threads' stacks to the driver's candidates and picks the prompts whose
        recorded roots are mixed (only where a bank's records are there to find)."""

        def allocate(self, values, budget, rng):
            for frame in sys._current_frames().values():
                while frame is not None:
                    cands = frame.f_locals.get("candidates")
                    if isinstance(cands, list) and cands and hasattr(cands[0], "outcomes"):
                        mixed = [i for i, c in enumerate(cands) if 0 < sum(c.outcomes()) < len(c.outcomes())]
                        out = np.zeros(len(values), dtype=np.int64)
                        for i in mixed[: budget // 4]:
                            out[i] = 4
                        return out
                    frame = frame.f_back
            return super().allocate(values, budget, rng)


    class WaveOverspend:  # a wave strategy asking for more than the step's budget in its second wave
        description = "overspends in wave 1"

        def plan(self, view, rng):
            if view.wave == 0:
                return Wave(roots={0: 2})
            if view.wave == 1:
                return Wave(roots={1: view.remaining})  # roots cost 2 units each
            return None


    class BadAnswer:
        description = "answers a string"

        def plan(self, view, rng):
            return "all of them"


    def one_shot(allocator):
        return Strategy(allocator, description=type(allocator).__name__)
''')

CASES = {
    "overspend": ("one_shot(Overspend())", "expected a count in [0, 16]"),
    "mutates": ("one_shot(Mutates())", "wrote into what it was given to read"),
    "hangs": ("one_shot(Hangs())", "gave no reply within call_timeout_s=1 s"),
    "exits": ("one_shot(Exits())", "raised SystemExit"),
    "global_numpy": ("one_shot(GlobalRandom())", "drew from the process-global random generator"),
    "global_python": ("one_shot(PythonRandom())", "drew from the process-global random generator"),
    "wave_overspend": ("WaveOverspend()", "would spend 56 units, 28 left"),
    "bad_answer": ("BadAnswer()", "returned a bad wave: returned 'all of them'; expected a Wave or None"),
}


@pytest.fixture
def plants(tmp_path, monkeypatch):
    (tmp_path / "violation_plants.py").write_text(PLANTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module("violation_plants")


def small_sim(**kw):
    return SimBenchConfig(**{"seeds": 1, "steps": 1, "warmup_steps": 0, "pool_size": 64, "candidates": 32,
                             "root_budget": 16, "continuations_per_root": 0, "oracle_upper_bound": False,
                             "strategy_timeout_s": 1.0, **kw})


def test_each_planted_violation_ends_its_arm_in_one_line_and_the_others_keep_their_verdict(plants):
    strategies = shaped_strategies(["uniform"], group_size=4, continuations_per_root=0)
    for name, (expr, _) in CASES.items():
        strategies[name] = eval(expr, vars(plants))  # noqa: S307  (the planted strategies above)
    results = run_sim_bench(small_sim(), strategies)
    violations = results["violations"]
    for name, (_, words) in CASES.items():
        assert name in violations, name
        line = violations[name]
        assert "\n" not in line and f"strategy {name!r}" in line and words in line, (name, line)
        assert name not in results["strategies"]  # no row, no verdict
    assert set(results["strategies"]) == {"uniform"}
    assert all(name not in (p["a"], p["b"]) for p in results["paired"] for name in CASES)


def test_a_strategy_that_peeks_at_unpaid_outcomes_gets_no_verdict(plants):
    """The stack walk finds the bank's records inside the bench (and picks mixed prompts), but
    not when its calls are replayed in a fresh process: the answers differ, no verdict."""
    from trace_gym.bench.bank import run_bank_bench
    from trace_gym.bench.config import BankBenchConfig
    from trace_gym.commands.bank import bank_path

    cfg = BankBenchConfig(bank=bank_path("math_python_smollm2"), seeds=1, steps=1, candidates=16, root_budget=8,
                          continuations_per_root=0, predictor="constant", oracle_upper_bound=False,
                          warmup_prompts=0)
    strategies = shaped_strategies(["uniform"], group_size=4, continuations_per_root=0)
    strategies["peeks"] = plants.one_shot(plants.Peeks())
    results = run_bank_bench(cfg, strategies)
    assert "answered otherwise when its calls were replayed outside the bench" in results["violations"]["peeks"]
    assert set(results["strategies"]) == {"uniform"}


def test_an_honest_stateful_wave_strategy_replays_alike(plants):
    strategies = {"fair": plants.one_shot(plants.Fair())}
    results = run_sim_bench(small_sim(seeds=2, steps=2), strategies)
    assert results["violations"] == {} and "fair" in results["strategies"]


def test_a_plugin_that_exits_while_it_imports_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    out = subprocess.run([sys.executable, "-m", "trace_gym.cli", "bench", "--sim", "--plugin", "exits_on_import",
                          "seeds=1", "steps=1"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "exits_on_import" in lines[0] and "SystemExit" in lines[0], out.stderr


@pytest.mark.parametrize("name", ["bad\nname", "", "x" * 65, "a b", "1abc"])
def test_strategy_names_are_plain_words(name):
    from trace_gym.strategies import STRATEGIES, register_strategy

    with pytest.raises(ValueError, match="strategy name"):
        register_strategy(name, STRATEGIES["uniform"])
