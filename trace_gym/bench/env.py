"""``trace-gym bench --env``: real episodes of a real policy as a
:class:`~trace_gym.bench.loop.BenchSource` (no training).

Each repetition loads ``candidates`` tasks plus warm-up tasks from the env family; a
warm-up batch of GRPO groups on the warm-up tasks trains the predictor first, and
every strategy then runs one step on the same candidates from a copy of it, from a cold
prefix cache (so costs stay comparable) and with the same seeds. Besides the shared
metrics, a row holds the seconds spent generating and in the env, the predictor's
share of the time, the mean reward, the prompt-level Spearman against the prompts'
empirical success, and the truncation counts.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_gym.bench.loop import Arm, run_bench
from trace_gym.bench.modes import BenchMode
from trace_gym.bench.config import EnvBenchConfig
from trace_gym.env.contract import env_difficulty_knobs
from trace_gym.predictor.kinds import PREDICTORS, make_predictor
from trace_gym.allocation.strategy import Strategy
from trace_gym.agent.transcripts import transcripts

#: Env seeds of a repetition: the warm-up batch and the strategies' batches.
_WARMUP_SEED_OFFSET, _ARM_SEED_OFFSET = 1, 2


@dataclass
class EnvRepetition:
    """One repetition: its candidates, and the predictor warmed up on other tasks."""

    source: EnvSource
    rep: int

    def __post_init__(self) -> None:
        cfg = self.source.config
        self.label = f"rep {self.rep + 1}"
        self.seed = cfg.seed + 7919 * self.rep
        n_warm = cfg.warmup_budget // max(cfg.group_size, 2)
        pool = self.source.family.load_tasks(cfg.candidates + n_warm, seed=self.seed)
        self.tasks, warm_tasks = pool[: cfg.candidates], pool[cfg.candidates:]
        self.warm = make_predictor(cfg.predictor, cfg.predictor_kwargs, model_path=self.source.policy_path,
                                   seed=cfg.seed)
        if cfg.warmup_budget and warm_tasks:
            grpo = self.source.strategies.get("uniform")
            if grpo is None:
                raise ValueError("the predictor warm-up runs the 'uniform' strategy; include it or set warmup_budget=0")
            warm = self._collect(warm_tasks, grpo, self.warm, cfg.warmup_budget, np.random.default_rng(self.seed),
                                 _WARMUP_SEED_OFFSET)
            from trace_gym import report

            self.source.warmups.append(warm.ledger.to_dict() | {"effective_ratio": report.effective_ratio(warm.trees)})
            self.source.say(f"{self.label}: predictor warm-up done, {warm.ledger.rollouts} rollouts "
                            f"({self.source.elapsed():.1f} s)")

    def _collect(self, tasks: Sequence[Any], strategy: Any, predictor: Any, budget: float,
                 rng: np.random.Generator, seed_offset: int, play: Any = None) -> Any:
        """One step of real rollouts from a cold prefix cache, learning half included."""
        from trace_gym.agent.loop import AgentRunner
        from trace_gym.agent.rollout import collect

        src = self.source
        src.engine.reset_prefix_cache()  # costs stay comparable across strategies
        runner = AgentRunner(src.engine, src.engine.tokenizer, src.family.make_env, src.sampling, src.agent_config)
        try:
            return collect(tasks, strategy, predictor, runner, budget, rng, seed=self.seed + seed_offset,
                           prefix_share=src.config.prefix_share, mixed_rule=src.config.mixed(),
                           **(play.kwargs() if play is not None else {}))
        finally:
            runner.close()

    def candidates(self, step: int) -> list[Any]:
        return self.tasks

    def predictor(self, arm: Arm) -> Any:
        return copy.deepcopy(self.warm)

    def rng(self, arm: Arm) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def step(self, arm: Arm, candidates: Sequence[Any], predictor: Any, budget: float,
             rng: np.random.Generator, *, measured: bool, play: Any) -> Any:
        out = self._collect(candidates, play.strategy, predictor, budget, rng, _ARM_SEED_OFFSET, play)
        out.extras["truth"] = chosen_truth(out, self.source.config.mixed())
        return out

    def arm_state(self, arm: Arm) -> None:
        return None  # live episodes: a step cannot be replayed from a state (no token-budget mode)

    def set_arm_state(self, arm: Arm, state: None) -> None:
        pass

    def measure(self, arm: Arm, steps: Sequence[Any]) -> dict[str, Any]:
        from trace_gym import report

        seconds: dict[str, float] = {}
        for s in steps:
            for k, v in s.ledger.seconds.items():
                seconds[k] = seconds.get(k, 0.0) + v
        rollout_s = seconds.get("generation", 0.0) + seconds.get("environment", 0.0)
        predictor_s = seconds.get("predictor_scoring", 0.0) + seconds.get("predictor_update", 0.0)
        leaves = [leaf.reward for s in steps for t in s.trees for leaf in t.leaves()]
        values = np.concatenate([s.values[np.flatnonzero(s.root_counts)] for s in steps])
        empirical = [t.targets(outcomes=True).get(0, math.nan) for s in steps for t in s.trees]
        truncations: dict[str, int] = {}
        for s in steps:
            for k, v in s.extras["truncations"].items():
                truncations[k] = truncations.get(k, 0) + v
        return {"generation_seconds": seconds.get("generation", 0.0),
                "environment_seconds": seconds.get("environment", 0.0),
                "predictor_share": predictor_s / max(rollout_s + predictor_s, 1e-12),
                "mean_reward": float(np.mean(leaves)) if leaves else math.nan,
                "prompt_spearman": report.spearman(values, empirical),
                "truncations": truncations}

    def after_arm(self, arm: Arm, steps: Sequence[Any]) -> None:
        from trace_gym import report

        src, trees = self.source, [t for s in steps for t in s.trees]
        if src.config.dump_episodes:
            done = src.dumped.setdefault(arm.name, [])
            done += transcripts(trees, src.config.dump_episodes - len(done))
        ratio = report.effective_ratio(trees, src.config.mixed())
        src.say(f"{self.label}: {arm.name} done, effective ratio {ratio:.2f} ({src.elapsed():.1f} s)")


def chosen_truth(out: Any, mixed_rule: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The predictor-quality truth real rollouts give: for each chosen prompt with at least two
    finished root rollouts, their success rate and whether they were mixed (by ``mixed_rule``,
    :mod:`trace_gym.step.mixed`; default the success line), and its candidate index. Only the chosen
    prompts have outcomes, so the measures cover them alone (a selected, not a random, set of
    prompts)."""
    from trace_gym.step.mixed import THRESHOLD

    rule = mixed_rule or THRESHOLD
    rows = [(int(i), *t.root_outcomes(), rule.roots(t)) for i, t in zip(out.tree_candidates, out.trees)]
    rows = [(i, s, n, m) for i, s, n, m in rows if n >= 2]
    index = np.array([i for i, *_ in rows], dtype=np.int64)
    rates = np.array([s / n for _, s, n, _ in rows], dtype=float)
    return rates, np.array([float(m) for *_, m in rows]), index


@dataclass
class EnvSource:
    """Real rollouts as a bench source (see the module docstring).

    Attributes:
        config: the bench config.
        family: the environment: ``make_env() -> AgentEnv`` and ``load_tasks(n, seed)``.
        strategies: the strategies run (the warm-up uses ``uniform``).
        engine: the rollout engine.
        say: receives one-line progress messages.
    """

    config: EnvBenchConfig
    family: Any
    strategies: Mapping[str, Strategy]
    engine: Any
    say: Callable[[str], None] = lambda msg: None
    mode: str = "env"
    warmups: list = field(default_factory=list)
    dumped: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from trace_gym.types import SamplingParams

        cfg = self.config
        self.t_start = time.perf_counter()
        self.repetitions, self.steps, self.warmup_steps = cfg.seeds, 1, 0
        self.budget_unit, self.nominal_budget = "nominal", cfg.nominal_budget
        self.agent_config = cfg.agent_config()
        self.sampling = SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed)
        self.policy_path = None
        self.difficulty_knobs = env_difficulty_knobs(self.family.make_env)  # named when nothing is mixed
        if "model_path" in PREDICTORS[cfg.predictor].needs:  # a critic built from the policy's own LM
            from trace_gym.models import resolve_model

            self.policy_path = str(resolve_model(cfg.policy))

    def elapsed(self) -> float:
        return time.perf_counter() - self.t_start

    def arms(self, strategies: Mapping[str, Strategy]) -> dict[str, Arm]:
        return {name: Arm(name, s, self.config.predictor) for name, s in strategies.items()}

    def repetition(self, rep: int) -> EnvRepetition:
        return EnvRepetition(self, rep)

    def results(self, strategies: Mapping[str, Strategy]) -> dict[str, Any]:
        cfg = self.config
        text = (f"every strategy's predictor starts from one trained on a warm-up batch of {cfg.warmup_budget} "
                "uniform rollouts of other tasks (per repetition), charged to no arm" if cfg.warmup_budget else
                "no warm-up: every predictor starts cold")
        return {"engine": type(self.engine).__name__, "warmup": {"batches": self.warmups, "description": text},
                "difficulty_knobs": self.difficulty_knobs}


def run_env_bench(cfg: EnvBenchConfig, strategies: Mapping[str, Strategy], family: Any, *,
                  engine: Any = None, progress: bool = False, say: Callable[[str], None] | None = None,
                  out_dir: str | None = None) -> dict[str, Any]:
    """Run the benchmark on real rollouts (:func:`~trace_gym.bench.loop.run_bench` over an
    :class:`EnvSource`); returns JSON-ready results.

    Args:
        cfg: the configuration.
        strategies: name -> strategy, already shaped for ``cfg``.
        family: the environment: ``make_env() -> AgentEnv`` and
            ``load_tasks(n, seed) -> list[Task]`` (``trace_gym.env.family.EnvFamily``).
        engine: an already-built rollout engine (else one is made from ``cfg`` and closed
            at the end).
        progress: show a progress bar.
        say: receives one-line progress messages (and the all-same-reward warnings).
        out_dir: where ``cfg.dump_episodes`` transcripts go (``episodes-<strategy>.jsonl``).
    """
    from trace_gym.utils import determinism
    from trace_gym.engines import make_engine

    if cfg.dump_episodes and out_dir is None:
        raise ValueError("dump_episodes needs an output folder (--out DIR)")
    say = say or (lambda msg: None)
    t_start = time.perf_counter()
    owned = engine is None
    with determinism.applied(cfg):  # before the engine: vLLM takes its thread count when it is made
        try:
            if owned:
                engine = make_engine(cfg.engine, cfg.policy)
            say(f"engine {type(engine).__name__} ready ({time.perf_counter() - t_start:.1f} s)")
            source = EnvSource(cfg, family, strategies, engine, say)
            results = run_bench(source, strategies, progress=progress, say=say)
        finally:
            if owned and engine is not None:
                engine.close()
    if source.dumped:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        results["episode_files"] = []
        for name, episodes in source.dumped.items():
            path = Path(out_dir) / f"episodes-{name}.jsonl"
            path.write_text("".join(json.dumps(e, default=str) + "\n" for e in episodes))
            results["episode_files"].append(str(path))
    return results


def intro(results: Mapping[str, Any]) -> list[str]:
    """The report's title and description of a bench on real rollouts."""
    from trace_gym.bench.report import applies_to, interval_note

    cfg = results["config"]
    return [f"## Allocation benchmark on real rollouts: {cfg['env']} with {cfg['policy']} "
            f"({results['engine']}; {cfg['seeds']} repetition(s); {results['seconds']:.0f} s)", "",
            f"Nominal budget per strategy: {results['nominal_budget']:g} trajectory-equivalents = "
            f"M (1 + N/2) with M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; "
            f"{cfg['candidates']} candidates; group size {cfg['group_size']} ({applies_to(results)}); "
            f"predictor: {cfg['predictor']}. Effective ratio: {interval_note(results)}."]


MODE = BenchMode("env", EnvBenchConfig, run_env_bench, intro, "run on real rollouts in this env family or env id "
                 "(e.g. math_python), with --policy MODEL", value="env", metavar="ENV", requires=("family",),
                 columns=(("Spearman prompt", "prompt_spearman"), ("replayed steps", "replayed_env_steps"),
                          ("errors", "episode_errors"), ("unspent cont.", "unspent_continuations"),
                          ("gen s", "generation_seconds"), ("env s", "environment_seconds"),
                          ("predictor share", "predictor_share"), ("mean reward", "mean_reward")))
