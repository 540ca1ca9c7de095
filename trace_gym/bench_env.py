"""``trace-gym bench --env ENV --policy MODEL``: strategies compared on real rollouts.

The same comparison as ``bench --sim``, but every rollout is a real episode of a real
policy in a real environment (no training):

1. a *warm-up* batch (GRPO groups on a separate task pool) trains the success
   predictor from its trees, so TRACE and PCL start from an informed predictor; its
   cost is reported apart and is the same for every strategy;
2. each strategy then starts from a copy of that predictor and builds trees for the
   same candidate pool at the same nominal budget (with the same env seeds per
   candidate, i.e. common random numbers);
3. the table reports effective ratio, contrast pairs, exact cost (generated and
   prefill tokens, env steps, seconds by phase) and the predictor's share of time.

Results have the ``bench --sim`` JSON shape: ``{"strategies": {name: {...}}, ...}``.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class EnvBenchConfig:
    """``trace-gym bench --env``: every field is a ``--flag``.

    The default is sized for the 2-core CPU machine: SmolLM2-135M on generated math
    tasks, 16 candidates, M = 8 roots with N = 2 continuations each (nominal 16).
    """

    env: str = field(default="math_python", metadata=_help("env family (trace_gym.registry.ENV_FAMILIES)"))
    policy: str = field(default="smollm2-135m", metadata=_help("model name or local HF folder"))
    engine: str = field(default="auto", metadata=_help("rollout engine: auto | hf | vllm"))
    seeds: int = field(default=1, metadata=_help("independent repetitions (fresh pools each)"))
    candidates: int = field(default=24, metadata=_help("candidate prompts per repetition"))
    root_budget: int = field(default=8, metadata=_help("M: root rollouts of a tree strategy"))
    continuations_per_root: int = field(default=2, metadata=_help("N: continuations per root; budget M (1 + N/2)"))
    group_size: int = field(default=4, metadata=_help("G: group size of the uniform and PCL baselines"))
    warmup_budget: int = field(default=16, metadata=_help("rollouts of the predictor warm-up batch (0: none)"))
    strategies: tuple[str, ...] = field(default=(), metadata=_help("comma-separated strategy names (default all)"))
    max_turns: int = field(default=3, metadata=_help("turns per episode"))
    max_turn_tokens: int = field(default=160, metadata=_help("generated tokens per turn"))
    max_episode_tokens: int = field(default=1024, metadata=_help("context limit per episode, tokens"))
    temperature: float = field(default=1.0, metadata=_help("sampling temperature"))
    predictor: str = field(default="embedding", metadata=_help("success predictor: embedding | constant"))
    seed: int = field(default=0, metadata=_help("base seed (tasks, envs, sampling)"))

    def __post_init__(self) -> None:
        for name in ("seeds", "candidates", "group_size", "max_turns", "max_turn_tokens", "max_episode_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.root_budget < 2 or self.continuations_per_root < 0 or self.warmup_budget < 0:
            raise ValueError(f"need root_budget >= 2, continuations_per_root >= 0, warmup_budget >= 0; got "
                             f"{self.root_budget}, {self.continuations_per_root}, {self.warmup_budget}")
        if self.predictor not in ("embedding", "constant"):
            raise ValueError(f"predictor must be 'embedding' or 'constant', got {self.predictor!r}")

    @property
    def nominal_budget(self) -> float:
        from trace_gym.budget import nominal_cost

        return nominal_cost(self.root_budget, self.continuations_per_root)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> "EnvBenchConfig":
        return config_from_mapping(cls, data)


def config_from_mapping(cls: type, data: dict[str, Any]) -> Any:
    """Build a frozen config dataclass from a dict (e.g. YAML), rejecting unknown keys by
    name; YAML lists become the tuples the fields declare."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown bench config keys {unknown}; known: {sorted(known)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _make_predictor(cfg: EnvBenchConfig):
    from trace_gym.predictor import ConstantPredictor, EmbeddingPredictor

    return EmbeddingPredictor(seed=cfg.seed) if cfg.predictor == "embedding" else ConstantPredictor(0.5)


def run_env_bench(cfg: EnvBenchConfig, progress: Callable[[str], None] | None = None,
                  engine: Any = None) -> dict[str, Any]:
    """Run the benchmark; returns JSON-ready results (see the module docstring).

    Args:
        cfg: the configuration.
        progress: called with one-line progress messages.
        engine: an already-built rollout engine (else one is made from ``cfg``).
    """
    import gymnasium

    from trace_gym import report
    from trace_gym.agent import AgentConfig, AgentRunner
    from trace_gym.budget import BudgetLedger
    from trace_gym.engines import make_engine
    from trace_gym.registry import env_family
    from trace_gym.rollout import collect, update_predictor
    from trace_gym.strategies import shaped_strategies
    from trace_gym.types import SamplingParams

    say = progress or (lambda msg: None)
    t_start = time.perf_counter()
    env_id, load_tasks, loader_kwargs, env_kwargs = env_family(cfg.env)
    if engine is None:
        engine = make_engine(cfg.engine, cfg.policy)
    say(f"engine {type(engine).__name__} ready ({time.perf_counter() - t_start:.1f} s)")
    agent_cfg = AgentConfig(max_turn_tokens=cfg.max_turn_tokens, max_episode_tokens=cfg.max_episode_tokens,
                            max_turns=cfg.max_turns)
    sampling = SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed)

    def make_runner() -> AgentRunner:
        factory = lambda: gymnasium.make(env_id, disable_env_checker=True, **env_kwargs)  # noqa: E731
        return AgentRunner(engine, engine.tokenizer, factory, sampling, agent_cfg, BudgetLedger())

    strategies = shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                                   continuations_per_root=cfg.continuations_per_root)
    per_seed: dict[str, list[dict[str, Any]]] = {name: [] for name in strategies}
    warmups = []
    for rep in range(cfg.seeds):
        seed = cfg.seed + 7919 * rep
        pool = load_tasks(cfg.candidates + max(cfg.warmup_budget // max(cfg.group_size, 2), 0), seed=seed,
                          **loader_kwargs)
        candidates, warm_tasks = pool[: cfg.candidates], pool[cfg.candidates:]
        predictor = _make_predictor(cfg)
        def run_batch(tasks, strategy, pred, budget, seed_offset):
            """One strategy's trees from a cold prefix cache, then its predictor step."""
            engine.reset_prefix_cache()  # costs stay comparable across strategies
            runner = make_runner()
            try:
                batch = collect(tasks, strategy, pred, runner, budget, np.random.default_rng(seed),
                                seed=seed + seed_offset)
                update_predictor(pred, batch)
            finally:
                runner.close()
            return batch, runner

        if cfg.warmup_budget and warm_tasks:
            grpo = shaped_strategies(["uniform"], group_size=cfg.group_size, continuations_per_root=0)["uniform"]
            warm, runner = run_batch(warm_tasks, grpo, predictor, cfg.warmup_budget, 1)
            warmups.append(runner.ledger.to_dict() | {"effective_ratio": report.effective_ratio(warm.trees)})
            say(f"rep {rep + 1}: warm-up done, {runner.ledger.rollouts} rollouts "
                f"({time.perf_counter() - t_start:.1f} s)")
        for name, strategy in strategies.items():
            batch, runner = run_batch(candidates, strategy, copy.deepcopy(predictor), cfg.nominal_budget, 2)
            per_seed[name].append(_metrics(batch, runner, report))
            say(f"rep {rep + 1}: {name} done, effective ratio {per_seed[name][-1]['effective_ratio']:.2f} "
                f"({time.perf_counter() - t_start:.1f} s)")

    results: dict[str, Any] = {"config": dataclasses.asdict(cfg), "nominal_budget": cfg.nominal_budget,
                               "engine": type(engine).__name__, "warmup": warmups, "strategies": {}}
    for name, rows in per_seed.items():
        entry: dict[str, Any] = {"description": strategies[name].description}
        for key in rows[0]:
            if isinstance(rows[0][key], dict):
                continue
            entry[key], entry[key + "_std"] = report.mean_std([r[key] for r in rows])
        entry["per_seed"] = rows
        results["strategies"][name] = entry
    results["seconds"] = time.perf_counter() - t_start
    return results


def _metrics(batch: Any, runner: Any, report: Any) -> dict[str, Any]:
    """One strategy's numbers on one candidate pool."""
    led = runner.ledger
    trees = batch.trees
    pairs = report.contrast_pairs_by_depth(trees)
    chosen = np.flatnonzero(batch.root_counts)
    empirical = [t.targets().get(0, float("nan")) for t in trees]
    rollout_seconds = led.seconds.get("generation", 0.0) + led.seconds.get("environment", 0.0)
    predictor_seconds = led.seconds.get("predictor_scoring", 0.0) + led.seconds.get("predictor_update", 0.0)
    return {
        "effective_ratio": report.effective_ratio(trees),
        "contrast_pairs": float(sum(pairs.values())),
        "contrast_pairs_per_unit": sum(pairs.values()) / max(led.nominal, 1e-12),
        "distinct_prompts": float(len(trees)),
        "rollouts_per_prompt": led.rollouts / max(1, len(trees)),
        "nominal_cost": led.nominal,
        "rollouts": float(led.rollouts),
        "continuations": float(led.continuations),
        "env_steps": float(led.env_steps),
        "generated_tokens": float(led.generated_tokens),
        "prefill_tokens": float(led.prefill_tokens),
        "allocator_ms": 1e3 * led.seconds.get("allocation", 0.0),
        "generation_seconds": led.seconds.get("generation", 0.0),
        "environment_seconds": led.seconds.get("environment", 0.0),
        "predictor_share": predictor_seconds / max(rollout_seconds + predictor_seconds, 1e-12),
        "mean_reward": float(np.mean([leaf.reward for t in trees for leaf in t.leaves()])) if trees else 0.0,
        "prompt_spearman": report.spearman(batch.values[chosen], empirical) if len(trees) > 2 else float("nan"),
        "contrast_pairs_by_depth": {str(d): float(c) for d, c in sorted(pairs.items())},
        "truncations": dict(runner.truncations),
    }


def format_env_bench(results: dict[str, Any]) -> str:
    """Markdown report of :func:`run_env_bench` results."""
    from trace_gym.report import markdown_table, pm

    cfg = results["config"]
    headers = ["strategy", "effective ratio", "contrast pairs", "pairs/unit", "prompts", "nominal",
               "rollouts + cont./2", "env steps", "gen tokens", "prefill tokens", "gen s", "env s",
               "alloc ms", "predictor share", "mean reward"]
    rows = []
    for name, r in results["strategies"].items():
        rows.append([name, pm(r["effective_ratio"], r["effective_ratio_std"]), r["contrast_pairs"],
                     r["contrast_pairs_per_unit"], r["distinct_prompts"], r["nominal_cost"],
                     f"{r['rollouts']:.0f} + {r['continuations']:.0f}/2", r["env_steps"], r["generated_tokens"],
                     r["prefill_tokens"], r["generation_seconds"], r["environment_seconds"], r["allocator_ms"],
                     f"{100 * r['predictor_share']:.1f} %", r["mean_reward"]])
    out = [
        f"## Allocation benchmark on real rollouts: {cfg['env']} with {cfg['policy']} "
        f"({results['engine']}; {cfg['seeds']} repetition(s); {results['seconds']:.0f} s)",
        "",
        f"Nominal budget per strategy: {results['nominal_budget']:g} trajectory-equivalents = M (1 + N/2) with "
        f"M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; {cfg['candidates']} candidates; "
        f"baseline group size {cfg['group_size']}; predictor: {cfg['predictor']} "
        f"(warmed up on {cfg['warmup_budget']} rollouts of other tasks).",
        "",
        markdown_table(headers, rows),
    ]
    return "\n".join(out)
