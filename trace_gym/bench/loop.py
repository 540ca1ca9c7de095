"""``trace-gym bench``: allocation strategies compared at one budget, on any rollout source.

One loop (:func:`run_bench`) runs every strategy on the same candidate pools with common
random numbers, at one budget per step, through the one step driver
(:func:`trace_gym.step.driver.run_step`, learning half included), and reports through one
path (:func:`summarise`; :mod:`trace_gym.bench.checks` for the paired verdicts and checks;
:mod:`trace_gym.bench.report` for the tables). Where the
rollouts come from is a :class:`BenchSource`, a short adapter:

- :mod:`trace_gym.bench.sim` (``bench --sim``): simulated tasks with a known success
  martingale. Every predictor-driven strategy uses the *learned* predictor (the
  headline); TRACE runs once more with the oracle, labelled as an upper bound.
- :mod:`trace_gym.bench.env` (``bench --env``): real episodes of a real policy in a real
  environment (no training). A warm-up batch of GRPO groups on other tasks trains the
  predictor first; each strategy starts from a copy of it.
- :mod:`trace_gym.bench.bank` (``bench --bank``): a rollout bank, real outcomes recorded
  once and replayed without replacement; a bench that asks for more than was recorded
  gives no verdict (:func:`trace_gym.bench.checks.exhaustion_check`).

Every source says how its predictors were warmed up before the first measured step
(``warmup`` in the results, printed under the title), and every arm records each step's
headline metrics and its predictor's quality on that step's candidates
(:mod:`trace_gym.predictor.quality`, against the truth the source knows: the simulator's
p, a bank's empirical rates), so the per-step curve shows whether a bench measured the
steady state or the cold start.

The budget is nominal (M (1 + N/2) trajectory-equivalents, the paper's convention) or,
with ``budget_unit="tokens"`` (sources whose steps can be replayed from the same state:
the simulator, a rollout bank), exact generated tokens: each strategy's nominal budget
is rescaled per step until it generates within 0.5 % of what the reference strategy
(uniform) generates at the nominal budget.

Uncertainty: metrics are means over repetitions (seeds) with a 95 % Student-t interval;
with one repetition no interval is printed, and when every repetition gave the same
value it prints ``± 0 (all n equal)``: no spread to estimate from, which is not
certainty; such a paired difference is judged by the exact sign test instead (apart
from 6 repetitions at 95 %). Paired differences and checks: :mod:`trace_gym.bench.checks`
(a check says PASS only when the paired interval shows its claim).

The functions take resolved objects (strategies, env family, engine); the face looks
the names up.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from trace_gym.bench.checks import Roles, bench_checks, paired_table, verdict
from trace_gym.bench.rank import ranking
from trace_gym.budget import BudgetLedger
from trace_gym.step.strategy_boundary import DEFAULT_STRATEGY_TIMEOUT_S, StrategyPlay, StrategyViolation
from trace_gym.allocation.waves import is_wave_strategy
from trace_gym.step.driver import StepResult
from trace_gym.step.learning import brief_repeats, reward_warning
from trace_gym.allocation.strategy import group_sized
from trace_gym.step.mixed import THRESHOLD, MixedRule

if TYPE_CHECKING:
    from trace_gym.allocation.strategy import Strategy

#: Relative tolerance of the token-budget mode (per step).
TOKEN_TOLERANCE = 0.005
#: Row-name suffix of the oracle upper bound.
UPPER_BOUND = " (oracle, upper bound)"


@dataclass(frozen=True)
class Arm:
    """One row of a bench: a strategy with the predictor it is driven by."""

    name: str
    strategy: Strategy
    predictor: str
    upper_bound: bool = False


# ---------------------------------------------------------------------- shared metrics
def tree_metrics(trees: Sequence[Any], ledger: BudgetLedger, steps: int, mixed_rule: MixedRule = THRESHOLD,
                 ) -> dict[str, Any]:
    """One strategy's numbers over ``steps`` steps of one repetition (per-step means), a tree
    counted as mixed by ``mixed_rule`` (:mod:`trace_gym.step.mixed`).

    Exact-cost ratios use the totals: contrast pairs and mixed prompts per 1,000
    generated tokens and per env step (replayed env steps included).
    """
    from trace_gym import report

    pairs = report.contrast_pairs_by_depth(trees)
    spent = report.continuations_by_depth(trees)
    n_pairs = float(sum(pairs.values()))
    mixed = float(sum(mixed_rule.tree(t) for t in trees if t.leaves()))
    in_mixed = sum(effective_samples(t) for t in trees if t.leaves() and mixed_rule.tree(t))
    tokens = max(ledger.generated_tokens, 1)
    env_steps = max(ledger.env_steps, 1)
    return {
        "effective_ratio": report.effective_ratio(trees, mixed_rule),
        "mixed_prompts": mixed / steps,
        "contrast_pairs": n_pairs / steps,
        "pairs_per_1k_tokens": 1e3 * n_pairs / tokens,
        "pairs_per_env_step": n_pairs / env_steps,
        "mixed_per_1k_tokens": 1e3 * mixed / tokens,
        "pairs_per_unit": n_pairs / max(ledger.nominal, 1e-12),
        "effective_samples_per_unit": in_mixed / max(ledger.nominal, 1e-12),
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
        "continuations_by_depth": {str(d): n / steps for d, (n, _) in spent.items()},
        "continuation_wins_by_depth": {str(d): w / steps for d, (_, w) in spent.items()},
    }


#: The per-depth counts of :func:`tree_metrics` (per step): contrast pairs by the depth of their deepest
#: common ancestor; continuations, and their successes, by the depth of the prefix they started from.
BY_DEPTH = ("contrast_pairs_by_depth", "continuations_by_depth", "continuation_wins_by_depth")


def effective_samples(tree: Any) -> float:
    """A tree's rollouts in trajectory-equivalents (root 1, continuation 1/2): what it holds
    of the budget (counted where the tree is mixed: its rollouts carry a group-relative signal)."""
    conts = sum(1 for b in tree.branches if b.is_continuation)
    return (len(tree.branches) - conts) + conts / 2


def tokens_to_target(steps: Sequence[Any], target: int) -> float:
    """Exact generated tokens until ``target`` mixed groups were collected over ``steps`` (in
    order; counted at the end of each wave, :attr:`~trace_gym.step.driver.StepResult.progress`);
    NaN when they never were."""
    tokens = mixed = 0
    for out in steps:
        for step_tokens, step_mixed in out.progress:
            if mixed + step_mixed >= target:
                return float(tokens + step_tokens)
        tokens += out.ledger.generated_tokens
        mixed += out.progress[-1][1] if out.progress else 0
    return math.nan


def step_record(out: Any, measured: bool, mixed_rule: MixedRule = THRESHOLD) -> dict[str, Any]:
    """One step of one arm, for the per-step curve: its headline metrics and, where the source
    put the candidates' truth in ``out.extras["truth"]`` (``(rates, mixed)``, or ``(rates, mixed,
    candidate indices)`` when it covers only some candidates), its predictor's
    quality on them (:func:`trace_gym.predictor.quality.predictor_quality`) and the spread of
    its values."""
    from trace_gym.predictor.quality import predictor_quality

    row = {"measured": measured} | {k: v for k, v in tree_metrics(out.trees, out.ledger, 1, mixed_rule).items()
                                    if k in ("effective_ratio", "mixed_prompts", "mixed_per_1k_tokens")}
    truth = out.extras.get("truth")
    if truth is not None:
        row |= predictor_quality(truth_values(out), truth[0], truth[1])
    row["value_spread"] = float(np.ptp(out.values)) if len(out.values) else 0.0
    return row


def truth_values(out: Any) -> np.ndarray:
    """The predicted values the truth covers: every candidate's, or with a third element
    (candidate indices) in ``extras["truth"]``, those candidates' only."""
    truth = out.extras["truth"]
    return np.asarray(out.values, dtype=float)[np.asarray(truth[2], dtype=np.int64)] if len(truth) > 2 else out.values


def pooled_quality(steps: Sequence[Any]) -> dict[str, float]:
    """The predictor's quality over the candidates of all ``steps`` together (those with truth)."""
    from trace_gym.predictor.quality import predictor_quality

    have = [s for s in steps if s.extras.get("truth") is not None]
    if not have:
        return {}
    values = np.concatenate([truth_values(s) for s in have])
    rates = np.concatenate([np.asarray(s.extras["truth"][0], dtype=float) for s in have])
    mixed = np.concatenate([np.asarray(s.extras["truth"][1], dtype=float) for s in have])
    return predictor_quality(values, rates, mixed)


def summarise(per_rep: Mapping[str, list[dict[str, Any]]], arms: Mapping[str, Arm]) -> dict[str, Any]:
    """Per arm: every scalar metric as mean over repetitions, ``<key>_ci`` its 95 % half-width
    (NaN with one repetition), the per-repetition rows, and depth-wise pair means."""
    from trace_gym import report

    out: dict[str, Any] = {}
    for name, rows in per_rep.items():
        arm = arms[name]
        entry: dict[str, Any] = {"description": getattr(arm.strategy, "description", ""), "predictor": arm.predictor,
                                 "acts_in_waves": is_wave_strategy(arm.strategy),
                                 "upper_bound": arm.upper_bound, "repetitions": len(rows)}
        for key, value in rows[0].items():
            if isinstance(value, (int, float)):
                entry[key], entry[key + "_ci"], _ = report.mean_ci([float(r[key]) for r in rows])
        entry["by_step"] = step_curve(rows)
        for key in BY_DEPTH:  # per step, averaged over the repetitions (a depth a repetition did not reach: 0)
            depths = sorted({d for r in rows for d in r.get(key, {})}, key=int)
            entry[key] = {d: float(np.mean([r.get(key, {}).get(d, 0.0) for r in rows])) for d in depths}
        entry["per_rep"] = rows
        out[name] = entry
    return out


def step_curve(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per step: each per-step key's mean over repetitions and its 95 % half-width (``<key>_ci``)."""
    from trace_gym import report

    steps = min((len(r.get("by_step", [])) for r in rows), default=0)
    curve = []
    for i in range(steps):
        at = [r["by_step"][i] for r in rows]
        point: dict[str, Any] = {"step": i, "measured": at[0]["measured"]}
        for key, value in at[0].items():
            if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
                point[key], point[key + "_ci"], _ = report.mean_ci([float(x.get(key, math.nan)) for x in at])
        curve.append(point)
    return curve


# ---------------------------------------------------------------------- the one loop
class Repetition(Protocol):
    """One repetition (seed) of a :class:`BenchSource`: its candidate pools, and how an
    arm's predictor, randomness and steps are made."""

    label: str  # e.g. "seed 0", named in warnings

    def candidates(self, step: int) -> Sequence[Any]:
        """The candidate pool of step ``step`` (the same for every arm)."""
        ...

    def predictor(self, arm: Arm) -> Any:
        """A fresh predictor of ``arm`` for this repetition."""
        ...

    def rng(self, arm: Arm) -> np.random.Generator:
        """The allocation randomness of ``arm`` for this repetition."""
        ...

    def step(self, arm: Arm, candidates: Sequence[Any], predictor: Any, budget: float,
             rng: np.random.Generator, *, measured: bool, play: StrategyPlay) -> StepResult:
        """One call of the step driver for ``arm`` with its own strategy (``play.strategy``,
        with ``play.kwargs()`` for the driver) and any per-arm runner state the repetition
        keeps (such as a bank's draws); returns the driver's result, the candidates' truth in
        ``extras["truth"]`` where the source knows it."""
        ...

    def arm_state(self, arm: Arm) -> Any:
        """The per-arm runner state that a step changes (``None`` when there is none), for the
        token-budget mode to roll back a try: a copy is taken before and restored after."""
        ...

    def set_arm_state(self, arm: Arm, state: Any) -> None:
        """Put back what :meth:`arm_state` returned."""
        ...

    def measure(self, arm: Arm, steps: Sequence[Any]) -> dict[str, Any]:
        """The source's own metrics over an arm's measured steps (merged into its row)."""
        ...

    def after_arm(self, arm: Arm, steps: Sequence[Any]) -> None:
        """Called once an arm's steps are done (transcripts, progress lines)."""
        ...


class BenchSource(Protocol):
    """Where a bench's rollouts come from: the simulator, real episodes, a rollout bank.

    Optional: ``difficulty_knobs``, the env's own (:class:`~trace_gym.env.contract.DifficultyKnobs`),
    named by the no-contrast warnings."""

    mode: str  # "sim" | "env" | ...
    config: Any  # the bench config (written into the results)
    repetitions: int
    steps: int  # steps per arm and repetition
    warmup_steps: int  # first steps run (the predictor trains) but not measured
    budget_unit: str  # "nominal" | "tokens"
    nominal_budget: float

    def arms(self, strategies: Mapping[str, Strategy]) -> dict[str, Arm]: ...

    def repetition(self, rep: int) -> Repetition: ...

    def results(self, strategies: Mapping[str, Strategy]) -> dict[str, Any]:
        """The source's extra results (a demo, a study, the engine's name)."""
        ...


def _token_matched_step(rep: Repetition, arm: Arm, cands: Sequence[Any], predictor: Any, budget: float,
                        rng: np.random.Generator, target: float, scale: float, measured: bool, play: StrategyPlay):
    """Run one step at ``budget * scale``, rescaling until its generated tokens are within
    :data:`TOKEN_TOLERANCE` of ``target``. Every try starts from the same RNG, predictor,
    strategy state (:meth:`~trace_gym.step.strategy_boundary.StrategyPlay.fork`) and per-arm runner
    state (:meth:`Repetition.arm_state`), so only the kept try counts.
    Returns (step result, its predictor, scale, its play)."""
    start, best = copy.deepcopy(rep.arm_state(arm)), None
    for _ in range(12):
        rep.set_arm_state(arm, copy.deepcopy(start))
        trial_rng, trial_pred, trial_play = copy.deepcopy(rng), copy.deepcopy(predictor), play.fork()
        out = rep.step(arm, cands, trial_pred, budget * scale, trial_rng, measured=measured, play=trial_play)
        err = out.ledger.generated_tokens / max(target, 1) - 1
        if best is None or abs(err) < abs(best[3]):
            best = (out, trial_pred, trial_rng, err, scale, copy.deepcopy(rep.arm_state(arm)), trial_play)
        if abs(err) <= TOKEN_TOLERANCE:
            break
        scale *= target / max(out.ledger.generated_tokens, 1)
    out, trial_pred, trial_rng, _, scale, state, trial_play = best
    rep.set_arm_state(arm, state)
    rng.bit_generator.state = trial_rng.bit_generator.state
    return out, trial_pred, scale, trial_play


def arms_with_oracle(strategies: Mapping[str, Strategy], predictor: str, oracle: str | None) -> dict[str, Arm]:
    """Every strategy driven by ``predictor`` (a strategy that names its own predictor kind, as
    ``strategy.predictor``, is driven by that one) and, with ``oracle`` (a predictor name) and
    a ``trace`` strategy, TRACE once more with it: the upper bound, labelled as one."""
    arms = {name: Arm(name, s, getattr(s, "predictor", None) or predictor) for name, s in strategies.items()}
    if oracle is not None and oracle != predictor and "trace" in strategies:
        arms["trace" + UPPER_BOUND] = Arm("trace" + UPPER_BOUND, strategies["trace"], oracle, upper_bound=True)
    return arms


def run_bench(source: BenchSource, strategies: Mapping[str, Strategy], *, progress: bool = False,
              say: Callable[[str], None] | None = None, roles: Roles = Roles(), replay: bool = True) -> dict[str, Any]:
    """Run every strategy of ``strategies`` on ``source``; returns JSON-ready results.

    Per repetition every arm sees the same candidate pools (common random numbers); the
    reference strategy (the baseline of ``roles``) runs first so that, in token mode, the
    others can be matched to what it generated. Per repetition, metrics pool the measured
    steps (after ``warmup_steps``), and ``by_step`` keeps every step's record
    (:func:`step_record`). ``say`` receives the no-contrast warnings as they happen.
    With ``deterministic`` in the source's config the process first enters deterministic
    mode (:mod:`trace_gym.utils.determinism`; ``results["deterministic"]`` says how it ran).

    Each arm runs its own copy of its strategy in every repetition, every call through its
    boundary (:mod:`trace_gym.step.strategy_boundary`, deadline ``config.strategy_timeout_s``); with
    ``replay``, the first repetition's calls are replayed in a fresh process
    (:mod:`trace_gym.step.strategy_replay`). An arm that broke a rule, or whose replay answered
    otherwise, gets no verdict: it is listed under ``violations`` (one line each) and has no row.
    """
    from trace_gym.utils import determinism

    with determinism.applied(source.config) as mode:  # before any repetition: its predictors read the thread count
        note = determinism.engine_note(getattr(source, "engine", None)) if mode is not None else None
        if note is not None and say is not None:
            say(note)
        return _run_arms(source, strategies, progress, say, roles, mode, replay)


def _run_arms(source: BenchSource, strategies: Mapping[str, Strategy], progress: bool,
              say: Callable[[str], None] | None, roles: Roles, mode: Any, replay: bool) -> dict[str, Any]:
    """:func:`run_bench`'s loop over repetitions and arms (in the mode it chose)."""
    import dataclasses

    from tqdm.auto import tqdm

    t_start = time.perf_counter()
    arms = source.arms(strategies)
    per_rep: dict[str, list[dict[str, Any]]] = {n: [] for n in arms}
    reference = roles.baseline if roles.baseline in arms else next(iter(arms))
    order = [reference] + [n for n in arms if n != reference]
    warnings: list[str] = []
    bar = tqdm(total=source.repetitions * len(arms), desc=f"bench --{source.mode}", disable=not progress,
               leave=False, dynamic_ncols=True)
    recorded: dict[str, StrategyPlay] = {}
    violations: dict[str, str] = {}
    strategy_timeout_s = getattr(source.config, "strategy_timeout_s", DEFAULT_STRATEGY_TIMEOUT_S)
    for r in range(source.repetitions):
        rep = source.repetition(r)
        target_tokens: list[float] = []
        for name in order:
            if name in violations:  # one broken rule ends the arm in every repetition
                bar.update(1)
                continue
            play = StrategyPlay.start(name, arms[name].strategy, record=replay and r == 0,
                                      timeout_s=strategy_timeout_s)
            row, warning = _run_arm(source, rep, arms[name], target_tokens, reference=name == reference, play=play)
            if "violation" in row:
                violations[name] = row["violation"]
                if say is not None:
                    say(f"NO VERDICT for {name}: {row['violation']}")
            elif r == 0 and replay:
                recorded[name] = play
            if warning:
                warnings.append(warning.at(f"{rep.label}, {name}"))
                if say is not None:
                    say(f"WARNING: {brief_repeats(warnings)[-1]}")
            per_rep[name].append(row)
            bar.update(1)
    bar.close()
    if recorded:
        from trace_gym.step.strategy_replay import replay_plays

        for name, why in replay_plays(recorded).items():
            violations.setdefault(name, why)
            if say is not None:
                say(f"NO VERDICT for {name}: {why}")
    ran = {n: per_rep[n] for n in arms if n not in violations}
    results: dict[str, Any] = {"mode": source.mode, "config": dataclasses.asdict(source.config),
                               "deterministic": None if mode is None else mode.describe(),
                               "nominal_budget": source.nominal_budget, "warnings": warnings,
                               "group_sized": group_sized(strategies), "violations": violations,
                               "strategies": summarise(ran, arms)}
    results |= source.results(strategies)
    return judge(results, roles) | {"seconds": time.perf_counter() - t_start}


def judge(results: dict[str, Any], roles: Roles) -> dict[str, Any]:
    """``results`` with the paired table, the checks and the verdict for ``roles`` (re-judging a
    finished bench with other roles needs no rerun)."""
    results["roles"] = {"baseline": roles.baseline, "method": roles.method, "pairs": [list(p) for p in roles.pairs]}
    results["paired"] = paired_table(results, roles)
    results["checks"] = bench_checks(results, roles)
    results["verdict"] = verdict(results, roles)
    results["ranking"] = ranking(results)
    return results


def _run_arm(source: BenchSource, rep: Any, arm: Arm, target_tokens: list[float], *,
             reference: bool, play: StrategyPlay) -> tuple[dict, str | None]:
    """One arm's steps in one repetition: its row (pooled metrics, source measures, per-step
    records) and its no-contrast warning. The reference arm appends its generated tokens per
    step to ``target_tokens``; in token mode the other arms are matched to them. A strategy
    that breaks a rule (:class:`~trace_gym.step.strategy_boundary.StrategyViolation`) ends the arm:
    its row is ``{"violation": the one line}``."""
    predictor, rng = rep.predictor(arm), rep.rng(arm)
    ledger, measured, by_step, scale, waves = BudgetLedger(), [], [], 1.0, []
    mixed_rule = source.config.mixed() if hasattr(source.config, "mixed") else THRESHOLD
    budget = source.nominal_budget
    try:
        for step in range(source.steps):
            cands, counted = rep.candidates(step), step >= source.warmup_steps
            play.step = step
            if source.budget_unit == "tokens" and not reference:
                out, predictor, scale, kept = _token_matched_step(rep, arm, cands, predictor, budget, rng,
                                                                  target_tokens[step], scale, counted, play)
                play.strategy, play.boundary, play.history = kept.strategy, kept.boundary, kept.history
            else:
                out = rep.step(arm, cands, predictor, budget, rng, measured=counted, play=play)
                if reference:
                    target_tokens.append(out.ledger.generated_tokens)
            by_step.append(step_record(out, counted, mixed_rule))
            if counted:
                ledger = ledger.merge(out.ledger)
                measured.append(out)
                waves.append(out.waves)
    except StrategyViolation as exc:
        if reference:  # the others are matched to its tokens: give them the nominal budget instead
            target_tokens.extend([math.nan] * (source.steps - len(target_tokens)))
        return {"violation": str(exc)}, None
    trees = [t for out in measured for t in out.trees]
    target = getattr(source.config, "mixed_groups_target", None)
    reach = {"tokens_to_target": tokens_to_target(measured, target)} if target else {}
    row = (tree_metrics(trees, ledger, len(measured), mixed_rule) | {"budget_scale": scale,
                                                                     "waves_per_step": _mean(waves)} | reach
           | pooled_quality(measured) | rep.measure(arm, measured) | {"by_step": by_step})
    rep.after_arm(arm, measured)
    if any(mixed_rule.tree(t) for t in trees):  # the rule found contrast (a spread line below the outcomes')
        return row, None
    return row, reward_warning(trees, getattr(source, "difficulty_knobs", None))


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan
