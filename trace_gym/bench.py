"""``trace-gym bench``: allocation strategies compared at one budget, simulated or real.

Both benches run every strategy on the same candidate pools with common random
numbers, at one budget per step, and report through one path (:func:`summarise`,
:func:`bench_checks`, :func:`format_bench`):

- :func:`run_sim_bench`: simulated tasks with a known success martingale
  (:mod:`trace_gym.sim`). Every predictor-driven strategy uses the *learned* predictor
  (the headline); TRACE runs once more with the oracle, labelled as an upper bound.
- :func:`run_env_bench`: real episodes of a real policy in a real environment (no
  training). A warm-up batch of GRPO groups on other tasks trains the predictor first;
  each strategy starts from a copy of it.

The budget is nominal (M (1 + N/2) trajectory-equivalents, the paper's convention) or,
with ``budget_unit="tokens"`` in the simulator, exact generated tokens: each strategy's
nominal budget is rescaled per step until it generates within 0.5 % of what the
reference strategy (uniform) generates at the nominal budget.

Uncertainty: metrics are means over repetitions (seeds) with a 95 % Student-t interval;
with one repetition no interval is printed. Checks compare strategies by the paired
difference over repetitions (common random numbers) and say when two strategies cannot
be told apart.

The functions take resolved objects (strategies, env family, engine); ``cli.py`` looks
the names up.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from trace_gym.allocation import GroupSized, solve_root
from trace_gym.bench_report import format_bench, write_bench_plots  # noqa: F401  (re-exported)
from trace_gym.budget import BudgetLedger
from trace_gym.config import EnvBenchConfig, SimBenchConfig

if TYPE_CHECKING:
    from trace_gym.strategy import Strategy

#: Relative tolerance of the token-budget mode (per step) and of its check (per run).
TOKEN_TOLERANCE = 0.005
TOKEN_CHECK_TOLERANCE = 0.02
#: Row-name suffix of the oracle upper bound.
UPPER_BOUND = " (oracle, upper bound)"


@dataclass(frozen=True)
class Arm:
    """One row of a bench: a strategy with the predictor it is driven by."""

    name: str
    strategy: Strategy
    predictor: str
    upper_bound: bool = False


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


# ---------------------------------------------------------------------- shared metrics
def tree_metrics(trees: Sequence[Any], ledger: BudgetLedger, steps: int) -> dict[str, Any]:
    """One strategy's numbers over ``steps`` steps of one repetition (per-step means).

    Exact-cost ratios use the totals: contrast pairs and mixed prompts per 1,000
    generated tokens and per env step (replayed env steps included).
    """
    from trace_gym import report

    pairs = report.contrast_pairs_by_depth(trees)
    n_pairs = float(sum(pairs.values()))
    mixed = float(sum(t.is_mixed() for t in trees if t.leaves()))
    tokens = max(ledger.generated_tokens, 1)
    env_steps = max(ledger.env_steps, 1)
    return {
        "effective_ratio": report.effective_ratio(trees),
        "contrast_pairs": n_pairs / steps,
        "pairs_per_1k_tokens": 1e3 * n_pairs / tokens,
        "pairs_per_env_step": n_pairs / env_steps,
        "mixed_per_1k_tokens": 1e3 * mixed / tokens,
        "pairs_per_unit": n_pairs / max(ledger.nominal, 1e-12),
        "distinct_prompts": len(trees) / steps,
        "rollouts_per_prompt": ledger.rollouts / max(1, len(trees)),
        "nominal_cost": ledger.nominal / steps,
        "rollouts": ledger.rollouts / steps,
        "continuations": ledger.continuations / steps,
        "env_steps": ledger.env_steps / steps,
        "replayed_env_steps": ledger.replayed_env_steps / steps,
        "episode_errors": ledger.errors / steps,
        "unspent_continuations": ledger.unspent_continuations / steps,
        "generated_tokens": ledger.generated_tokens / steps,
        "prefill_tokens": ledger.prefill_tokens / steps,
        "allocator_ms": 1e3 * ledger.seconds.get("allocation", 0.0) / steps,
        "contrast_pairs_by_depth": {str(d): c / steps for d, c in sorted(pairs.items())},
    }


def summarise(per_rep: Mapping[str, list[dict[str, Any]]], arms: Mapping[str, Arm]) -> dict[str, Any]:
    """Per arm: every scalar metric as mean over repetitions, ``<key>_ci`` its 95 % half-width
    (NaN with one repetition), the per-repetition rows, and depth-wise pair means."""
    from trace_gym import report

    out: dict[str, Any] = {}
    for name, rows in per_rep.items():
        arm = arms[name]
        entry: dict[str, Any] = {"description": arm.strategy.description, "predictor": arm.predictor,
                                 "upper_bound": arm.upper_bound, "repetitions": len(rows)}
        for key, value in rows[0].items():
            if isinstance(value, (int, float)):
                entry[key], entry[key + "_ci"], _ = report.mean_ci([float(r[key]) for r in rows])
        depths = sorted({d for r in rows for d in r.get("contrast_pairs_by_depth", {})}, key=int)
        entry["contrast_pairs_by_depth"] = {
            d: float(np.mean([r.get("contrast_pairs_by_depth", {}).get(d, 0.0) for r in rows])) for d in depths}
        entry["per_rep"] = rows
        out[name] = entry
    return out


def reward_warning(trees: Sequence[Any]) -> str | None:
    """A one-line warning when every finished leaf of a step has the same outcome (all
    0 or all 1): then no prompt is mixed and no strategy can find contrast; the step
    teaches a group-relative update nothing. ``None`` otherwise (or with no leaves)."""
    from trace_gym.tree import SUCCESS_THRESHOLD

    rewards = [leaf.reward for t in trees for leaf in t.leaves() if leaf.reward is not None]
    if not rewards:
        return None
    wins = sum(r >= SUCCESS_THRESHOLD for r in rewards)
    if 0 < wins < len(rewards):
        return None
    outcome = "0 (every rollout failed)" if wins == 0 else "1 (every rollout succeeded)"
    return (f"every one of the {len(rewards)} rollouts got reward {outcome}: no prompt is mixed, so there is no "
            "contrast to find and a group-relative update learns nothing; make the tasks "
            + ("easier, the policy stronger or the turn/token limits larger" if wins == 0 else "harder"))


def transcripts(trees: Sequence[Any], limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` full episodes (root to leaf): prompt, each turn's action and
    observation messages, the reward, and how the episode ended."""
    out: list[dict[str, Any]] = []
    for tree in trees:
        for leaf in tree.leaves():
            if len(out) >= limit:
                return out
            turns = []
            for node_id in tree.path(leaf.id)[1:]:
                node = tree.nodes[node_id]
                turns.append({"action": node.text, "observation": node.info.get("observation", []),
                              **{k: node.info[k] for k in ("truncation", "error") if k in node.info}})
            out.append({"task_id": tree.task_id, "prompt": tree.nodes[0].text, "leaf": leaf.id,
                        "depth": leaf.depth, "reward": leaf.reward, "turns": turns})
    return out


# ---------------------------------------------------------------------- checks
def bench_checks(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdict, on the headline rows (learned predictor; upper bounds excluded).

    Each check is ``{"name", "status": PASS | FAIL | SKIP, "detail"}``. Comparisons of
    two strategies state the paired difference over repetitions and whether it is
    distinguishable from zero at 95 %.
    """
    from trace_gym import report

    s = {n: v for n, v in results["strategies"].items() if not v["upper_bound"]}
    checks: list[dict[str, Any]] = []

    def add(name: str, needs: Sequence[str], ok: Callable[[], bool], detail: Callable[[], str]) -> None:
        missing = [n for n in needs if n not in s]
        if missing:
            checks.append({"name": name, "status": "SKIP", "detail": f"needs {', '.join(missing)}"})
        else:
            checks.append({"name": name, "status": "PASS" if ok() else "FAIL", "detail": detail()})

    def eff(n: str) -> float:
        return s[n]["effective_ratio"]

    def versus(a: str, b: str) -> str:
        ea = [r["effective_ratio"] for r in s[a]["per_rep"]]
        eb = [r["effective_ratio"] for r in s[b]["per_rep"]]
        mean, half, n = report.paired_difference(ea, eb)
        if n < 2:
            told = "one repetition: cannot tell apart"
        else:
            told = "distinguishable" if abs(mean) > half else "NOT distinguishable"
            told = f"difference {mean:+.3f} ± {half:.3f} over {n} paired repetitions, {told}"
        return f"{eff(a):.3f} vs {eff(b):.3f}; {told}"

    for baseline in ("uniform", "pcl", "random_tree"):
        add(f"trace effective ratio above {baseline}", ["trace", baseline],
            lambda b=baseline: eff("trace") > eff(b), lambda b=baseline: versus("trace", b))
    add("trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)",
        ["trace", "uniform"], lambda: eff("trace") >= 2 * eff("uniform"),
        lambda: f"{eff('trace'):.3f} = {eff('trace') / max(eff('uniform'), 1e-12):.2f}x {eff('uniform'):.3f}")
    for ablation in ("trace_root_only", "trace_prefix_only"):
        add(f"{ablation} between uniform and trace", ["uniform", ablation, "trace"],
            lambda a=ablation: eff("uniform") < eff(a) < eff("trace"),
            lambda a=ablation: f"{eff('uniform'):.3f} < {eff(a):.3f} < {eff('trace'):.3f}")
    unit = results["config"].get("budget_unit", "nominal")
    everyone = list(results["strategies"].values())
    if unit == "tokens":
        reference = s.get("uniform", everyone[0])["generated_tokens"]
        worst = max(abs(v["generated_tokens"] / max(reference, 1) - 1) for v in everyone)
        add("equal generated tokens (every strategy within 2 % of uniform's)", list(s)[:1],
            lambda: worst <= TOKEN_CHECK_TOLERANCE,
            lambda: f"per step: {reference:,.0f} tokens; largest deviation {100 * worst:.2f} %")
    else:
        costs = [v["nominal_cost"] for v in everyone]
        add("equal nominal budget", list(s)[:1],
            lambda: max(costs) - min(costs) <= 1e-9 * max(1.0, results["nominal_budget"]),
            lambda: f"per step: {sorted(set(round(c, 6) for c in costs))} (budget {results['nominal_budget']:g})")
    return checks


def _group_sized(strategies: Mapping[str, Strategy]) -> list[str]:
    return [n for n, s in strategies.items() if isinstance(s.root_allocator, GroupSized)]


# ---------------------------------------------------------------------- the simulator bench
def sim_arms(strategies: Mapping[str, Strategy], cfg: SimBenchConfig) -> dict[str, Arm]:
    """Every strategy with the configured predictor, plus TRACE with the oracle (an upper bound)."""
    arms = {name: Arm(name, s, cfg.predictor) for name, s in strategies.items()}
    if cfg.oracle_upper_bound and cfg.predictor != "oracle" and "trace" in strategies:
        name = "trace" + UPPER_BOUND
        arms[name] = Arm(name, strategies["trace"], "oracle", upper_bound=True)
    return arms


def _sim_predictor(kind: str, cfg: SimBenchConfig, world: Any, pool: Any, seed: int) -> Any:
    from trace_gym import sim_predictors

    if kind == "learned":
        return sim_predictors.LearnedPredictor(pool.features)
    if kind == "noisy":
        return sim_predictors.NoisyOraclePredictor.with_spearman(cfg.noisy_spearman, world, seed=seed)
    return sim_predictors.OraclePredictor()


def sim_world(cfg: SimBenchConfig) -> Any:
    """The simulated world of ``cfg``, its task feature noise calibrated to ``feature_spearman``."""
    from trace_gym import sim
    from trace_gym.sim_predictors import noise_for_spearman

    base = dict(target_mixed=cfg.target_mixed, mean_success=cfg.mean_success, group_size=cfg.group_size,
                step_concentration=cfg.step_concentration)
    prior = sim.SimWorld(**base).prior()
    return sim.SimWorld(**base, feature_noise=noise_for_spearman(cfg.feature_spearman, prior))


def prefix_weight_for_share(n_prompt: int, n_prefix: int, share: float) -> float:
    """Weight of each prefix sample so that prefix samples hold ``share`` of a batch's
    total weight, prompt samples weighing 1 each (the paper's batches: about 6 % prefix)."""
    if not 0 <= share < 1:
        raise ValueError(f"prefix share must lie in [0, 1), got {share!r}")
    if n_prefix == 0 or n_prompt == 0:
        return 1.0
    return share / (1 - share) * n_prompt / n_prefix


def _sim_update(predictor: Any, trees: Sequence[Any], share: float) -> None:
    from trace_gym import sim

    states, targets = sim.training_examples(trees)
    deep = np.array([st.turn > 0 for st in states], dtype=bool)
    w = np.where(deep, prefix_weight_for_share(int((~deep).sum()), int(deep.sum()), share), 1.0)
    predictor.update(states, targets, w)


def _sim_step(pool, cands, strategy, predictor, budget, world, rng, ledger):
    from trace_gym import sim

    return sim.run_step(pool, cands, strategy, predictor, budget, world, rng, ledger)


def _token_matched_step(pool, cands, strategy, predictor, budget, world, rng, target: float, scale: float):
    """Run one step at ``budget * scale``, rescaling until its generated tokens are within
    :data:`TOKEN_TOLERANCE` of ``target``. Every try starts from the same RNG and
    predictor state, so only the kept try counts. Returns (step result, ledger, scale)."""
    best = None
    for _ in range(12):
        trial_rng, trial_pred, led = copy.deepcopy(rng), copy.deepcopy(predictor), BudgetLedger()
        out = _sim_step(pool, cands, strategy, trial_pred, budget * scale, world, trial_rng, led)
        err = led.generated_tokens / max(target, 1) - 1
        if best is None or abs(err) < abs(best[3]):
            best = (out, led, trial_rng, err, scale)
        if abs(err) <= TOKEN_TOLERANCE:
            break
        scale *= target / max(led.generated_tokens, 1)
    out, led, trial_rng, _, scale = best
    rng.bit_generator.state = trial_rng.bit_generator.state
    return out, led, scale


def run_sim_bench(cfg: SimBenchConfig, strategies: Mapping[str, Strategy], *, progress: bool = False) -> dict[str, Any]:
    """Run the simulated allocation benchmark; returns JSON-ready results.

    Every arm sees the same task pools and candidate draws (common random numbers per
    seed and step). Per seed, metrics pool the measured steps (after ``warmup_steps``).
    """
    from trace_gym import report

    t_start = time.perf_counter()
    world = sim_world(cfg)
    arms = sim_arms(strategies, cfg)
    budget = cfg.nominal_budget
    measured = cfg.steps - cfg.warmup_steps
    per_rep: dict[str, list[dict[str, Any]]] = {n: [] for n in arms}
    reference = "uniform" if "uniform" in arms else next(iter(arms))
    warnings: list[str] = []
    order = [reference] + [n for n in arms if n != reference]
    bar = _progress(cfg.seeds * len(arms), "bench --sim", progress)
    from trace_gym import sim

    for seed in range(cfg.seeds):
        pool = sim.make_pool(world, cfg.pool_size, np.random.default_rng([seed, 0]))
        draws = [np.random.default_rng([seed, 1, step]).choice(cfg.pool_size, cfg.candidates, replace=False)
                 for step in range(cfg.steps)]
        target_tokens: list[float] = []
        for name in order:
            arm = arms[name]
            rng = np.random.default_rng([seed, 2, zlib.crc32(name.encode())])
            predictor = _sim_predictor(arm.predictor, cfg, world, pool, seed)
            ledger, trees, preds, truth = BudgetLedger(), [], [], []
            prefix_pred, prefix_true, prefix_depth = [], [], []
            scale = 1.0
            for step, cands in enumerate(draws):
                if cfg.budget_unit == "tokens" and name != reference:
                    (step_trees, values, _), step_ledger, scale = _token_matched_step(
                        pool, cands, arm.strategy, predictor, budget, world, rng, target_tokens[step], scale)
                else:
                    step_ledger = BudgetLedger()
                    step_trees, values, _ = _sim_step(pool, cands, arm.strategy, predictor, budget, world, rng,
                                                      step_ledger)
                    if name == reference:
                        target_tokens.append(step_ledger.generated_tokens)
                if step >= cfg.warmup_steps:  # predictor quality on every visited prefix, before it trains on them
                    states = [n.snapshot for t in step_trees for n in t.nodes[1:] if not n.terminal]
                    prefix_pred.append(predictor.predict(states) if states else np.zeros(0))
                    prefix_true.append(np.array([st.value for st in states]))
                    prefix_depth.append(np.array([st.turn for st in states], dtype=int))
                with step_ledger.phase("predictor_update"):
                    _sim_update(predictor, step_trees, cfg.prefix_share)
                if step >= cfg.warmup_steps:
                    ledger = ledger.merge(step_ledger)
                    trees += step_trees
                    preds.append(values)
                    truth.append(pool.success[cands])
            warning = reward_warning(trees)
            if warning:
                warnings.append(f"seed {seed}, {name}: {warning}")
            row = tree_metrics(trees, ledger, measured)
            pp, pt, pd = (np.concatenate(x) for x in (prefix_pred, prefix_true, prefix_depth))
            row |= {
                "budget_scale": scale,
                "prompt_spearman": report.spearman(np.concatenate(preds), np.concatenate(truth)),
                "prefix_spearman": report.spearman(pp, pt),
                "prefix_spearman_by_depth": {str(d): r for d, r in report.spearman_by_depth(pp, pt, pd).items()},
            }
            per_rep[name].append(row)
            bar.update(1)
    bar.close()
    results: dict[str, Any] = {"mode": "sim", "config": dataclasses.asdict(cfg), "nominal_budget": budget,
                               "warnings": warnings, "group_sized": _group_sized(strategies),
                               "strategies": summarise({n: per_rep[n] for n in arms}, arms)}
    results["root_allocation_demo"] = {
        "values": list(cfg.demo_values), "budgets": list(cfg.demo_budgets),
        "allocations": [solve_root(np.array(cfg.demo_values), b).tolist() for b in cfg.demo_budgets],
    }
    if "trace" in strategies:  # which predictor target is closer to the true V (oracle-driven expansion)
        results["target_estimators"] = sim.target_error_study(strategies["trace"], world=world,
                                                              nominal_budget=budget, candidates=cfg.candidates)
    results["checks"] = bench_checks(results)
    results["seconds"] = time.perf_counter() - t_start
    return results


# ---------------------------------------------------------------------- the real-rollout bench
def predictor_spec(kind: str, policy_path: str | None = None, seed: int = 0,
                   kwargs: dict[str, Any] | None = None) -> tuple[type, tuple, dict[str, Any]]:
    """``(class, args, kwargs)`` that :func:`make_predictor` builds, checked without
    loading anything (``train --dry-run`` calls it).

    Raises:
        ValueError: an unknown kind, or a keyword the kind's constructor does not take.
    """
    import inspect

    from trace_gym import predictor

    kwargs = dict(kwargs or {})
    if kind == "embedding":
        cls, args = predictor.EmbeddingPredictor, ()
    elif kind == "lm_critic":
        if policy_path in (None, "", "None"):
            raise ValueError("the lm_critic predictor needs a local model folder (policy)")
        cls, args = predictor.LMCriticPredictor, (policy_path,)
    elif kind == "constant":
        cls, args = predictor.ConstantPredictor, ()
    else:
        raise ValueError(f"unknown predictor {kind!r}; known: embedding, lm_critic, constant")
    params = inspect.signature(cls).parameters
    if "seed" in kwargs:
        raise ValueError("predictor_kwargs: 'seed' comes from the config's seed; remove it from predictor_kwargs")
    takes = sorted(n for n in list(params)[len(args):] if n != "seed")
    bad = sorted(set(kwargs) - set(takes))
    if bad:
        raise ValueError(f"predictor_kwargs: {kind} does not take {', '.join(map(repr, bad))}; "
                         f"it takes {', '.join(takes) or 'none'}")
    if "dtype" in kwargs and kwargs["dtype"] not in predictor.DTYPES:
        raise ValueError(f"predictor_kwargs: dtype must be one of {', '.join(predictor.DTYPES)}, "
                         f"got {kwargs['dtype']!r}")
    if "seed" in params:
        kwargs = {"seed": seed, **kwargs}
    return cls, args, kwargs


def make_predictor(kind: str, policy_path: str | None = None, seed: int = 0,
                   kwargs: dict[str, Any] | None = None) -> Any:
    """A success predictor by kind: ``embedding`` (frozen MiniLM + MLP head, the CPU
    default), ``lm_critic`` (the policy's own LM with a scalar head), ``constant`` (0.5).

    ``kwargs`` (the configs' ``predictor_kwargs``) go to the predictor's constructor, e.g.
    ``{"device": "cuda", "dtype": "bfloat16"}`` puts the LM critic on the GPU. Errors as
    :func:`predictor_spec`.
    """
    cls, args, built = predictor_spec(kind, policy_path, seed, kwargs)
    return cls(*args, **built)


def _env_metrics(batch: Any) -> dict[str, Any]:
    from trace_gym import report

    led = batch.ledger
    trees = batch.trees
    chosen = np.flatnonzero(batch.root_counts)
    empirical = [t.targets().get(0, math.nan) for t in trees]
    rollout_seconds = led.seconds.get("generation", 0.0) + led.seconds.get("environment", 0.0)
    predictor_seconds = led.seconds.get("predictor_scoring", 0.0) + led.seconds.get("predictor_update", 0.0)
    leaves = [leaf.reward for t in trees for leaf in t.leaves()]
    return tree_metrics(trees, led, 1) | {
        "generation_seconds": led.seconds.get("generation", 0.0),
        "environment_seconds": led.seconds.get("environment", 0.0),
        "predictor_share": predictor_seconds / max(rollout_seconds + predictor_seconds, 1e-12),
        "mean_reward": float(np.mean(leaves)) if leaves else math.nan,
        "prompt_spearman": report.spearman(batch.values[chosen], empirical),
        "truncations": dict(batch.truncations),
    }


def run_env_bench(cfg: EnvBenchConfig, strategies: Mapping[str, Strategy], family: Any, *,
                  engine: Any = None, progress: bool = False, say: Callable[[str], None] | None = None,
                  out_dir: str | None = None) -> dict[str, Any]:
    """Run the benchmark on real rollouts; returns JSON-ready results.

    Args:
        cfg: the configuration.
        strategies: name -> strategy, already shaped for ``cfg``.
        family: the environment: ``make_env() -> AgentEnv`` and
            ``load_tasks(n, seed) -> list[Task]`` (``trace_gym.registry.EnvFamily``).
        engine: an already-built rollout engine (else one is made from ``cfg``).
        progress: show a progress bar.
        say: receives one-line progress messages (and the all-same-reward warnings).
        out_dir: where ``cfg.dump_episodes`` transcripts go (``episodes-<strategy>.jsonl``).
    """
    from trace_gym.agent import AgentConfig, AgentRunner
    from trace_gym.engines import make_engine
    from trace_gym.models import resolve_model
    from trace_gym.rollout import collect, update_predictor
    from trace_gym.types import SamplingParams

    say = say or (lambda msg: None)
    t_start = time.perf_counter()
    if engine is None:
        engine = make_engine(cfg.engine, cfg.policy)
    say(f"engine {type(engine).__name__} ready ({time.perf_counter() - t_start:.1f} s)")
    agent_cfg = AgentConfig(max_turn_tokens=cfg.max_turn_tokens, max_episode_tokens=cfg.max_episode_tokens,
                            max_turns=cfg.max_turns)
    sampling = SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed)
    arms = {name: Arm(name, s, cfg.predictor) for name, s in strategies.items()}
    policy_path = str(resolve_model(cfg.policy)) if cfg.predictor == "lm_critic" else None
    per_rep: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    warmups, warnings, dumped = [], [], {}
    if cfg.dump_episodes and out_dir is None:
        raise ValueError("dump_episodes needs an output folder (--out DIR)")
    bar = _progress(cfg.seeds * len(arms), f"bench --env {cfg.env}", progress)

    def run_batch(tasks, strategy, predictor, budget, seed, seed_offset):
        """One strategy's trees from a cold prefix cache, then its predictor step."""
        engine.reset_prefix_cache()  # costs stay comparable across strategies
        runner = AgentRunner(engine, engine.tokenizer, family.make_env, sampling, agent_cfg)
        try:
            batch = collect(tasks, strategy, predictor, runner, budget, np.random.default_rng(seed),
                            seed=seed + seed_offset)
            n_prefix = sum(1 for t in batch.trees for n in t.nodes[1:] if not n.terminal)
            update_predictor(predictor, batch,
                             prefix_weight=prefix_weight_for_share(len(batch.trees), n_prefix, cfg.prefix_share))
        finally:
            runner.close()
        return batch, runner

    for rep in range(cfg.seeds):
        seed = cfg.seed + 7919 * rep
        n_warm = cfg.warmup_budget // max(cfg.group_size, 2)
        pool = family.load_tasks(cfg.candidates + n_warm, seed=seed)
        candidates, warm_tasks = pool[: cfg.candidates], pool[cfg.candidates:]
        predictor = make_predictor(cfg.predictor, policy_path, seed=cfg.seed, kwargs=cfg.predictor_kwargs)
        if cfg.warmup_budget and warm_tasks:
            grpo = strategies.get("uniform")
            if grpo is None:
                raise ValueError("the predictor warm-up runs the 'uniform' strategy; include it or set warmup_budget=0")
            warm, runner = run_batch(warm_tasks, grpo, predictor, cfg.warmup_budget, seed, 1)
            warmups.append(warm.ledger.to_dict() | {"effective_ratio": _env_metrics(warm)["effective_ratio"]})
            say(f"rep {rep + 1}: predictor warm-up done, {warm.ledger.rollouts} rollouts "
                f"({time.perf_counter() - t_start:.1f} s)")
        for name, arm in arms.items():
            batch, runner = run_batch(candidates, arm.strategy, copy.deepcopy(predictor), cfg.nominal_budget, seed, 2)
            per_rep[name].append(_env_metrics(batch))
            warning = reward_warning(batch.trees)
            if warning:
                warnings.append(f"rep {rep + 1}, {name}: {warning}")
                say(f"WARNING: {warnings[-1]}")
            if cfg.dump_episodes:
                dumped[name] = dumped.get(name, []) + transcripts(batch.trees, cfg.dump_episodes - len(dumped.get(name, [])))
            bar.update(1)
            say(f"rep {rep + 1}: {name} done, effective ratio {per_rep[name][-1]['effective_ratio']:.2f} "
                f"({time.perf_counter() - t_start:.1f} s)")
    bar.close()
    results: dict[str, Any] = {"mode": "env", "config": dataclasses.asdict(cfg), "nominal_budget": cfg.nominal_budget,
                               "engine": type(engine).__name__, "warmup": warmups, "warnings": warnings,
                               "group_sized": _group_sized(strategies),
                               "strategies": summarise(per_rep, arms)}
    if dumped:
        import json
        from pathlib import Path

        Path(out_dir).mkdir(parents=True, exist_ok=True)
        results["episode_files"] = []
        for name, episodes in dumped.items():
            path = Path(out_dir) / f"episodes-{name}.jsonl"
            path.write_text("".join(json.dumps(e, default=str) + "\n" for e in episodes))
            results["episode_files"].append(str(path))
    results["checks"] = bench_checks(results)
    results["seconds"] = time.perf_counter() - t_start
    return results
