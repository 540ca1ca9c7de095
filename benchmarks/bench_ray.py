"""Ray backend speed against the in-process path, in one run (CPU, this machine).

1. **Env steps/s with 1 vs 2 env pools** against the in-process env thread pool, on the same
   episodes: ``E`` episodes reset, then ``K`` rounds in which every episode steps once (one
   batched call per pool per round, as in a training step). Two envs:

   - ``math_python``: the default env; every step runs a code cell in the sandboxed Python
     kernel (a forked process, so its CPU work is outside the pool's interpreter);
   - ``python-bound``: GuessNumber whose step also spins ``--spin-ms`` of pure Python in
     the env's own interpreter (a tool implemented in Python: BFCL's executors, BM25 in
     process). Here the GIL serialises the in-process pool, and separate pool processes
     can use both cores.

2. **Ray's per-step overhead against the in-process step on the same work**: one rollout
   step (``trace_gym.agent.rollout.collect``: TRACE, SmolLM2-135M in float32 on the HF engine,
   the math_python env, fixed seeds) in process, and on Ray with 1 rollout worker + 1 env
   pool (the same compute: one engine with the same torch threads, so the difference is
   Ray: actor calls, serialisation, batching waits). Both produce the same trees (checked
   here: same generated tokens and env steps). Goal: overhead <= 10 %. For reference also
   2 workers + 2 pools (1 torch thread each). Median of ``--repeats`` steps after one
   warm-up step each; actor start-up is reported apart (once per run, not per step).

Usage: ``python benchmarks/bench_ray.py [--repeats 3] [--episodes 16] [--rounds 4] [--skip-step]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from environments.guess_number import GuessNumberEnv  # noqa: E402
from trace_gym.agent.loop import AgentRunner, Episode  # noqa: E402
from trace_gym.report import markdown_table as _table  # noqa: E402


def markdown_table(rows: list[dict]) -> str:
    return _table(list(rows[0]), [list(r.values()) for r in rows])

CELL = "```python\nx = sum(i * i for i in range(150000))\nprint(x % 97)\n```"


class PythonBoundGuess(GuessNumberEnv):
    """GuessNumber whose step also spins ``spin_ms`` of pure Python (a Python-implemented tool)."""

    def __init__(self, spin_ms: float = 5.0):
        super().__init__(max_turns=64, lie_prob=0.0)
        self.spin_ms = spin_ms

    def step(self, action):
        end = time.perf_counter() + self.spin_ms / 1000
        x = 0
        while time.perf_counter() < end:
            x += sum(range(200))
        return super().step(action)


def env_cases(spin_ms: float) -> list[tuple[str, object, object, str]]:
    from environments.math_python.env import MathPythonEnv
    from environments.math_python.generated import generate_mixed_tasks
    from environments.guess_number import make_tasks

    math_task = generate_mixed_tasks(1, seed=0)[0]
    guess_task = make_tasks(1, low=1, high=10**9, seed=0)[0]
    return [("math_python", functools.partial(MathPythonEnv, max_turns=64), math_task, CELL),
            ("python-bound", functools.partial(PythonBoundGuess, spin_ms), guess_task, "guess: 1")]


def _episodes(task, n: int) -> list[Episode]:
    return [Episode(task, 1000 + i, None, (), [], None, (), uid=i) for i in range(n)]


def steps_in_process(make_env, task, action: str, episodes: int, rounds: int, threads: int) -> float:
    """Env steps/s of the agent loop's own env thread pool."""
    slot = type("R", (), {"make_env": staticmethod(make_env)})()
    eps = _episodes(task, episodes)
    with ThreadPoolExecutor(threads) as pool:
        opened = list(pool.map(lambda ep: AgentRunner._open_env(slot, ep.task, ep.seed, None), eps))
        for ep, (env, *_rest) in zip(eps, opened):
            ep.env = env
        t0 = time.perf_counter()
        for _ in range(rounds):
            rows = list(pool.map(lambda ep: AgentRunner._env_step(ep, action), eps))
            assert all(r[2] is None for r in rows), rows[0][2]
        seconds = time.perf_counter() - t0
        list(pool.map(AgentRunner._close_env, eps))
    return episodes * rounds / seconds


def steps_on_pools(make_env, task, action: str, episodes: int, rounds: int, pools: int, threads: int) -> tuple[float, float]:
    """Env steps/s through env pool actors (one batched call per pool per round); and the
    pools' start-up seconds."""
    from trace_gym.train.distributed.env_pool import PoolExecutor
    from trace_gym.train.distributed.launch import launch_env_pools

    t0 = time.perf_counter()
    group = launch_env_pools(make_env, pools, threads=threads, num_cpus=0)
    startup = time.perf_counter() - t0
    executor = PoolExecutor(group)
    eps = _episodes(task, episodes)
    for ep, (handle, _, _, error, *_rest) in zip(eps, executor.open([(ep.task, ep.seed, None) for ep in eps])):
        assert error is None, error
        ep.env = handle
    t0 = time.perf_counter()
    for _ in range(rounds):
        futures = [executor.submit(AgentRunner._env_step, ep, action) for ep in eps]
        executor.flush()
        rows = [f.result() for f in futures]
        assert all(r[2] is None for r in rows), rows[0][2]
    seconds = time.perf_counter() - t0
    executor.map(AgentRunner._close_env, eps)
    executor.shutdown()
    group.shutdown()
    return episodes * rounds / seconds, startup


def bench_envs(args) -> str:
    rows = []
    for name, make_env, task, action in env_cases(args.spin_ms):
        base = steps_in_process(make_env, task, action, args.episodes, args.rounds, args.threads)
        row = {"env": name, "in-process steps/s": f"{base:.0f}"}
        for n in (1, 2):
            rate, startup = steps_on_pools(make_env, task, action, args.episodes, args.rounds, n, args.threads)
            row[f"{n} pool{'s' if n > 1 else ''} steps/s"] = f"{rate:.0f} ({rate / base:.2f}x)"
            row[f"{n}-pool start s"] = f"{startup:.1f}"
        rows.append(row)
    return markdown_table(rows)


# ---------------------------------------------------------------------- part 2: one step
def _step_args():
    from environments.math_python.generated import generate_mixed_tasks
    from trace_gym.agent.loop import AgentConfig
    from trace_gym.predictor.kinds import ConstantPredictor
    from trace_gym.strategies import shaped_strategies
    from trace_gym.types import SamplingParams

    tasks = generate_mixed_tasks(8, seed=5)
    strategy = shaped_strategies(["trace"], group_size=4, continuations_per_root=2)["trace"]
    agent = AgentConfig(max_turn_tokens=64, max_episode_tokens=2048, max_turns=3, straggler_seconds=60)
    return tasks, strategy, ConstantPredictor(0.5), agent, SamplingParams(temperature=1.0, seed=3)


def _make_env():
    from environments.math_python.env import MathPythonEnv

    return MathPythonEnv(few_shot=True, answer_extraction="boxed_or_last_number", max_turns=3)


def one_step(runner) -> tuple[float, object]:
    from trace_gym.agent.rollout import collect

    tasks, strategy, predictor, _, _ = _step_args()
    t0 = time.perf_counter()
    try:
        batch = collect(tasks, strategy, predictor, runner, 8, np.random.default_rng(2), seed=17)
    finally:
        runner.close()
    return time.perf_counter() - t0, batch


def in_process_steps(args, model: str) -> list:
    """``repeats`` timed in-process steps (after a warm-up step), with no Ray process alive."""
    import torch

    from trace_gym.engines.hf import HFEngine

    _, _, _, agent, sampling = _step_args()
    torch.set_num_threads(2)
    engine = HFEngine(model, dtype="float32", device="cpu")
    runs = []
    for r in range(args.repeats + 1):
        seconds, batch = one_step(AgentRunner(engine, engine.tokenizer, _make_env, sampling, agent))
        if r:
            runs.append((seconds, batch, batch.ledger.seconds["generation"]))
    engine.close()
    return runs


def ray_steps(args, model: str, workers: int, threads: int) -> tuple[list, float]:
    """``repeats`` timed steps on ``workers`` rollout workers + as many env pools, and the
    actors' start-up seconds. Each run records the seconds spent inside the engines."""
    from trace_gym.train.distributed.launch import launch_env_pools, launch_rollout_workers
    from trace_gym.train.distributed.runner import RayAgentRunner

    _, _, _, agent, sampling = _step_args()
    t0 = time.perf_counter()
    group = launch_rollout_workers("hf", model, workers, engine_kwargs={"dtype": "float32", "device": "cpu"},
                                   num_cpus=0, num_threads=threads)
    pools = launch_env_pools(_make_env, workers, threads=8, num_cpus=0)
    startup = time.perf_counter() - t0
    runs = []
    for r in range(args.repeats + 1):
        before = _engine_seconds(group)
        seconds, batch = one_step(RayAgentRunner(group, group.tokenizer, pools, sampling, agent))
        if r:
            runs.append((seconds, batch, _engine_seconds(group) - before))
    group.close()
    pools.shutdown()
    return runs, startup


def step_table(results: list[tuple[str, int, list, float | None]]) -> str:
    rows = []
    base = results[0]
    base_med = statistics.median(s for s, _, _ in base[2])
    base_work = (base[2][0][1].ledger.generated_tokens, base[2][0][1].ledger.env_steps)
    base_env = statistics.median(b.ledger.seconds.get("environment", 0.0) for _, b, _ in base[2])
    for label, threads, runs, startup in results:
        med = statistics.median(s for s, _, _ in runs)
        gen = statistics.median(b.ledger.seconds["generation"] for _, b, _ in runs)
        inside = statistics.median(i for _, _, i in runs)
        env = statistics.median(b.ledger.seconds.get("environment", 0.0) for _, b, _ in runs)
        work = [(b.ledger.generated_tokens, b.ledger.env_steps) for _, b, _ in runs]
        ray = startup is not None
        own = (gen - inside) + max(0.0, env - base_env)  # waiting that is Ray's: transport + slower env round trips
        rows.append({"setup": label, "torch threads": threads, "step s": f"{med:.2f}",
                     "vs first in-process": "-" if label == base[0] else f"{100 * (med / base_med - 1):+.1f} %",
                     "in engine s": f"{inside:.2f}", "generate wait s": f"{gen:.2f}", "env wait s": f"{env:.2f}",
                     "Ray's own s (% of step)": f"{own:.2f} ({100 * own / med:.1f} %)" if ray else "-",
                     "runs": ", ".join(f"{s:.1f}" for s, _, _ in runs),
                     "same work": "yes" if all(w == base_work for w in work) else f"no: {work} vs {base_work}",
                     "actor start s": f"{startup:.1f}" if ray else "-"})
    return markdown_table(rows)


def _engine_seconds(group) -> float:
    """Seconds the group's workers spent inside their engines so far (the slowest worker's)."""
    if group is None:
        return 0.0
    infos = [group.transport.call(w, "info").result() for w in group.workers]
    return max(i["engine_seconds"] for i in infos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16, help="episodes stepping at once (part 1)")
    parser.add_argument("--rounds", type=int, default=8, help="steps per episode (part 1)")
    parser.add_argument("--threads", type=int, default=8, help="env threads per pool and in process (part 1)")
    parser.add_argument("--spin-ms", type=float, default=5.0, help="pure-Python work per python-bound step")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per setup (part 2)")
    parser.add_argument("--skip-step", action="store_true", help="part 1 only")
    args = parser.parse_args()

    from trace_gym.train.distributed.cluster import ray_available, start_ray
    from trace_gym.models import pull_model

    ok, why = ray_available()
    if not ok:
        raise SystemExit(why)
    model = str(pull_model("smollm2-135m", progress=False))
    results = []
    if not args.skip_step:  # in process first, before any Ray process runs on these cores
        results.append(("in-process (before Ray started)", 2, in_process_steps(args, model), None))
    cluster = start_ray(num_cpus=os.cpu_count())
    try:
        print(f"## Env steps/s: {args.episodes} episodes x {args.rounds} rounds, {args.threads} env threads "
              f"per pool (and in process), {os.cpu_count()} CPUs\n")
        print(bench_envs(args))
        if not args.skip_step:
            for workers, threads in ((1, 2), (2, 1)):
                runs, startup = ray_steps(args, model, workers, threads)
                label = f"Ray: {workers} worker{'s' if workers > 1 else ''} + {workers} pool{'s' if workers > 1 else ''}"
                results.append((label, threads, runs, startup))
    finally:
        cluster.shutdown()
    if not args.skip_step:
        results.append(("in-process (after Ray stopped)", 2, in_process_steps(args, model), None))
        print("\n## One TRACE rollout step (8 candidates, budget 8 = 4 roots + 8 continuations / 2, "
              "SmolLM2-135M fp32, math_python, 64 tokens/turn, 3 turns)\n")
        print(step_table(results))
        print("\nRay's own s: the driver's generate wait beyond the seconds spent inside the engines, plus "
              "env waiting beyond the in-process step's.")


if __name__ == "__main__":
    main()
