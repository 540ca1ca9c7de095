"""``trace-gym bench``: allocation strategies compared at one budget, on any rollout source.

One loop (:func:`run_bench`) runs every strategy on the same candidate pools with common
random numbers, at one budget per step, through the one step driver
(:func:`trace_gym.driver.run_step`, learning half included), and reports through one
path (:func:`summarise`, :func:`bench_checks`, :func:`format_bench`). Where the
rollouts come from is a :class:`BenchSource`, a short adapter:

- :mod:`trace_gym.bench_sim` (``bench --sim``): simulated tasks with a known success
  martingale. Every predictor-driven strategy uses the *learned* predictor (the
  headline); TRACE runs once more with the oracle, labelled as an upper bound.
- :mod:`trace_gym.bench_env` (``bench --env``): real episodes of a real policy in a real
  environment (no training). A warm-up batch of GRPO groups on other tasks trains the
  predictor first; each strategy starts from a copy of it.
- :mod:`trace_gym.bench_bank` (``bench --bank``): a rollout bank, real outcomes recorded
  once and replayed without replacement; a bench that asks for more than was recorded
  gives no verdict (:func:`exhaustion_check`).

The budget is nominal (M (1 + N/2) trajectory-equivalents, the paper's convention) or,
with ``budget_unit="tokens"`` (sources whose steps can be replayed from the same state:
the simulator, a rollout bank), exact generated tokens: each strategy's nominal budget
is rescaled per step until it generates within 0.5 % of what the reference strategy
(uniform) generates at the nominal budget.

Uncertainty: metrics are means over repetitions (seeds) with a 95 % Student-t interval;
with one repetition no interval is printed, and when every repetition gave the same
value it prints ``± 0 (all n equal)``: no spread to estimate from, which is not
certainty; such a paired difference is judged by the exact sign test instead (apart
from 6 repetitions at 95 %). Checks compare strategies by the paired difference over
repetitions (common random numbers) and say when two strategies cannot be told apart; a
comparison whose rows found no mixed prompt is SKIPped ("no contrast"), never PASSed.

The functions take resolved objects (strategies, env family, engine); the face looks
the names up.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from trace_gym.bench_report import format_bench, write_bench_plots  # noqa: F401  (re-exported)
from trace_gym.budget import BudgetLedger
from trace_gym.driver import reward_warning
from trace_gym.strategy import group_sized

if TYPE_CHECKING:
    from trace_gym.strategy import Strategy

#: Relative tolerance of the token-budget mode (per step) and of its check (per run).
TOKEN_TOLERANCE = 0.005
TOKEN_CHECK_TOLERANCE = 0.02
#: Row-name suffix of the oracle upper bound.
UPPER_BOUND = " (oracle, upper bound)"
#: Largest share of refused (``exhausted``) branches a rollout-bank bench gives a verdict with.
EXHAUSTED_LIMIT = 0.01


@dataclass(frozen=True)
class Arm:
    """One row of a bench: a strategy with the predictor it is driven by."""

    name: str
    strategy: Strategy
    predictor: str
    upper_bound: bool = False


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
Effective = Callable[[str], float]  # row name -> its mean effective ratio


@dataclass(frozen=True)
class Comparison:
    """One check of the verdict that compares headline rows' effective ratios.

    ``passes(eff)`` is the claim; ``detail(eff, versus)`` says what was measured
    (``versus(a, b)`` states the paired difference of a and b over repetitions). Every
    comparison goes through :func:`no_contrast` on the rows it reads (``needs``): when
    none of them found a mixed prompt it is SKIPped, never PASSed (0 vs 0 proves
    nothing). A ratio's ``denominator`` must itself show contrast: "2x of nothing" holds
    for anything.
    """

    name: str
    needs: tuple[str, ...]
    passes: Callable[[Effective], bool]
    detail: Callable[[Effective, Callable[[str, str], str]], str]
    denominator: str | None = None


#: The comparisons of :func:`bench_checks`, in the order they print.
COMPARISONS: tuple[Comparison, ...] = (
    *(Comparison(f"trace effective ratio above {b}", ("trace", b),
                 lambda eff, b=b: eff("trace") > eff(b), lambda eff, versus, b=b: versus("trace", b))
      for b in ("uniform", "pcl", "random_tree")),
    Comparison("trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)",
               ("trace", "uniform"), lambda eff: eff("trace") >= 2 * eff("uniform"),
               lambda eff, versus: f"{eff('trace'):.3f} = {eff('trace') / max(eff('uniform'), 1e-12):.2f}x "
                                  f"{eff('uniform'):.3f}",
               denominator="uniform"),
    *(Comparison(f"{a} between uniform and trace", ("uniform", a, "trace"),
                 lambda eff, a=a: eff("uniform") < eff(a) < eff("trace"),
                 lambda eff, versus, a=a: f"{eff('uniform'):.3f} < {eff(a):.3f} < {eff('trace'):.3f}")
      for a in ("trace_root_only", "trace_prefix_only")),
)


def bench_checks(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdict, on the headline rows (learned predictor; upper bounds excluded).

    Each check is ``{"name", "status": PASS | FAIL | SKIP, "detail"}``: the bank guard
    (:func:`exhaustion_check`), every :data:`COMPARISONS` entry, then the equal-budget
    check. Comparisons of two strategies state the paired difference over repetitions
    and whether it is distinguishable from zero at 95 %. A comparison is SKIPped when a
    row it needs is missing, when the bank ran out (the guard FAILs, names the bank
    sizes needed: no verdict), or when its rows have no contrast (:func:`no_contrast`:
    every rollout of every prompt agreed, e.g. every reward 0). The budget check reads
    costs, not outcomes, so it holds whatever the rewards.
    """
    s = {n: v for n, v in results["strategies"].items() if not v["upper_bound"]}
    checks: list[dict[str, Any]] = []
    guard = exhaustion_check(results)
    if guard is not None:
        checks.append(guard)
    no_verdict = guard is not None and guard["status"] == "FAIL"
    for comparison in COMPARISONS:
        checks.append(_compare(comparison, s, no_verdict))
    checks.append(budget_check(results, s))
    return checks


def _needs(names: Sequence[str], rows: Mapping[str, Any]) -> dict[str, Any] | None:
    missing = [n for n in names if n not in rows]
    return {"status": "SKIP", "detail": f"needs {', '.join(missing)}"} if missing else None


def _compare(c: Comparison, s: Mapping[str, Any], no_verdict: bool) -> dict[str, Any]:
    """One :class:`Comparison` on the headline rows ``s``: SKIP, PASS or FAIL."""
    skip = _needs(c.needs, s)
    if skip is None and no_verdict:
        skip = {"status": "SKIP", "detail": "no verdict: the bank ran out (see above)"}
    if skip is None and no_contrast({n: s[n] for n in c.needs}):
        skip = {"status": "SKIP", "detail": f"no contrast: {', '.join(c.needs)} found no mixed prompt in any "
                "repetition (every rollout of a prompt had the same outcome), so there is nothing to compare"}
    if skip is None and c.denominator is not None and no_contrast({c.denominator: s[c.denominator]}):
        skip = {"status": "SKIP", "detail": f"no contrast: {c.denominator} found no mixed prompt in any repetition, "
                "so a ratio to it is undefined"}
    if skip is not None:
        return {"name": c.name, **skip}

    def eff(n: str) -> float:
        return s[n]["effective_ratio"]

    return {"name": c.name, "status": "PASS" if c.passes(eff) else "FAIL",
            "detail": c.detail(eff, lambda a, b: _versus(s, a, b))}


def _versus(s: Mapping[str, Any], a: str, b: str) -> str:
    """Effective ratios of rows ``a`` and ``b`` and their paired difference over repetitions."""
    from trace_gym import report

    mean, half, n = report.paired_difference([r["effective_ratio"] for r in s[a]["per_rep"]],
                                             [r["effective_ratio"] for r in s[b]["per_rep"]])
    if n < 2:
        told = "one repetition: cannot tell apart"
    else:
        told = "distinguishable" if report.distinguishable(mean, half, n) else "NOT distinguishable"
        spread = f"± {half:.3f}" if half > 0 else "± 0 (all equal: no spread; judged by the sign test)"
        told = f"difference {mean:+.3f} {spread} over {n} paired repetitions, {told}"
    return f"{s[a]['effective_ratio']:.3f} vs {s[b]['effective_ratio']:.3f}; {told}"


def budget_check(results: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, Any]:
    """Every strategy (upper bounds included) spent the same budget per step: the nominal one,
    or in token mode generated tokens within :data:`TOKEN_CHECK_TOLERANCE` of uniform's."""
    everyone = list(results["strategies"].values())
    if results["config"].get("budget_unit", "nominal") == "tokens":
        name = "equal generated tokens (every strategy within 2 % of uniform's)"
        skip = _needs(list(s)[:1], s)
        if skip is not None:
            return {"name": name, **skip}
        reference = s.get("uniform", everyone[0])["generated_tokens"]
        worst = max(abs(v["generated_tokens"] / max(reference, 1) - 1) for v in everyone)
        return {"name": name, "status": "PASS" if worst <= TOKEN_CHECK_TOLERANCE else "FAIL",
                "detail": f"per step: {reference:,.0f} tokens; largest deviation {100 * worst:.2f} %"}
    name = "equal nominal budget"
    skip = _needs(list(s)[:1], s)
    if skip is not None:
        return {"name": name, **skip}
    costs = [v["nominal_cost"] for v in everyone]
    ok = max(costs) - min(costs) <= 1e-9 * max(1.0, results["nominal_budget"])
    return {"name": name, "status": "PASS" if ok else "FAIL",
            "detail": f"per step: {sorted(set(round(c, 6) for c in costs))} (budget {results['nominal_budget']:g})"}


def no_contrast(rows: Mapping[str, Any]) -> bool:
    """Whether comparing ``rows`` is degenerate: none of them found a mixed prompt in any
    repetition (every effective ratio 0, or NaN where a repetition gave no prompt a rollout)."""
    return bool(rows) and not any(r["effective_ratio"] > 0 or any(x["effective_ratio"] > 0 for x in r["per_rep"])
                                  for r in rows.values())


def verdict(results: Mapping[str, Any]) -> str:
    """The headline line: TRACE against uniform on the headline rows (learned predictor,
    upper bounds excluded), by the paired difference of effective ratios over repetitions,
    stated plainly whichever way it goes; "NO VERDICT" when the bank ran out or neither
    found a mixed prompt. Paired differences that are all equal have no spread to build an
    interval from: the line says so, and the exact sign test decides
    (:func:`trace_gym.report.distinguishable`: from 6 repetitions at 95 %)."""
    from trace_gym import report

    s = {n: v for n, v in results["strategies"].items() if not v["upper_bound"]}
    if "trace" not in s or "uniform" not in s:
        return "no verdict: the TRACE-vs-uniform headline needs both strategies in the run"
    guard = exhaustion_check(results)
    if guard is not None and guard["status"] == "FAIL":
        detail = guard["detail"]
        return detail if detail.startswith("NO VERDICT") else f"NO VERDICT: {detail}"
    if no_contrast({n: s[n] for n in ("trace", "uniform")}):
        return ("NO VERDICT: no contrast (neither TRACE nor uniform found a mixed prompt; every rollout of a prompt "
                "agreed)")
    a, b = s["trace"]["effective_ratio"], s["uniform"]["effective_ratio"]
    mean, half, n = report.paired_difference([r["effective_ratio"] for r in s["trace"]["per_rep"]],
                                             [r["effective_ratio"] for r in s["uniform"]["per_rep"]])
    if n < 2:
        return f"TRACE and uniform cannot be told apart from one repetition (effective ratio {a:.3f} vs {b:.3f})"
    ratio = f"{a / b:.2f}x" if b > 0 else "uniform found no mixed prompt"
    if report.distinguishable(mean, half, n):
        word = "TRACE beats uniform" if mean > 0 else "TRACE is WORSE than uniform"
    else:
        word = "TRACE and uniform cannot be told apart"
    spread = (f"± {half:.3f} (95 %, " if half > 0 else
              "± 0 (all equal: no spread for an interval; exact sign test at 95 %, ")
    return (f"{word}: effective ratio {a:.3f} vs {b:.3f}, difference {mean:+.3f} {spread}{n} paired repetitions, "
            f"predictor {s['trace']['predictor']}; {ratio})")


def exhaustion_check(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """On a rollout bank (rows with ``exhausted_share``): PASS when every headline row had at
    most :data:`EXHAUSTED_LIMIT` of its branches refused in every repetition; else FAIL, naming
    the rows (their worst repetition's share) and the bank sizes the bench needed (the most
    roots asked of one prompt, the most continuations of one prefix). An upper-bound row
    never decides the verdict; when it ran out, the detail says its bound is not a valid one.
    ``None`` for sources that cannot run out."""
    every = {n: v for n, v in results["strategies"].items() if "exhausted_share" in v}
    if not every:
        return None
    rows = {n: v for n, v in every.items() if not v.get("upper_bound")}
    bounds = {n: max(r["exhausted_share"] for r in v["per_rep"]) for n, v in every.items() if v.get("upper_bound")}
    spent = [f"{n} ran out at {100 * x:.1f} %, so it is not a valid bound" for n, x in bounds.items()
             if x > EXHAUSTED_LIMIT]
    if not rows:
        return None
    name = f"bank large enough for a verdict (at most {100 * EXHAUSTED_LIMIT:g} % of branches refused per strategy)"
    share = {n: max(r["exhausted_share"] for r in v["per_rep"]) for n, v in rows.items()}  # the worst repetition
    over = {n: x for n, x in share.items() if x > EXHAUSTED_LIMIT}
    bank = results.get("bank", {})
    have = f"this bank: R = {bank.get('roots', '?')} roots per prompt, K = {bank.get('continuations', '?')} " \
           "continuations per prefix"
    if not over:
        worst = max(share.values())
        note = "".join(f"; {x}" for x in spent)
        return {"name": name, "status": "PASS", "detail": f"largest exhausted share {100 * worst:.2f} %; {have}{note}"}
    roots = max(int(r.get("roots_needed", 0)) for v in rows.values() for r in v["per_rep"])
    conts = max(int(r.get("continuations_needed", 0)) for v in rows.values() for r in v["per_rep"])
    shares = ", ".join(f"{n} {100 * x:.1f} %" for n, x in sorted(over.items(), key=lambda kv: -kv[1]))
    return {"name": name, "status": "FAIL",
            "detail": f"NO VERDICT: exhausted share {shares}; this bench needs a bank with at least {roots} roots per "
                      f"prompt and {conts} continuations per recorded prefix ({have}); record a larger bank or lower "
                      "the budget, the steps or the group size"}


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

    def step(self, candidates: Sequence[Any], strategy: Strategy, predictor: Any, budget: float,
             rng: np.random.Generator, *, measured: bool) -> Any:
        """One call of the step driver; returns its result (``trees``, ``ledger``,
        ``values``, ``root_counts``, ``learning``)."""
        ...

    def measure(self, arm: Arm, steps: Sequence[Any]) -> dict[str, Any]:
        """The source's own metrics over an arm's measured steps (merged into its row)."""
        ...

    def after_arm(self, arm: Arm, steps: Sequence[Any]) -> None:
        """Called once an arm's steps are done (transcripts, progress lines)."""
        ...


class BenchSource(Protocol):
    """Where a bench's rollouts come from: the simulator, real episodes, a rollout bank."""

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


def _token_matched_step(rep: Repetition, cands: Sequence[Any], strategy: Strategy, predictor: Any, budget: float,
                        rng: np.random.Generator, target: float, scale: float, measured: bool):
    """Run one step at ``budget * scale``, rescaling until its generated tokens are within
    :data:`TOKEN_TOLERANCE` of ``target``. Every try starts from the same RNG and
    predictor state, so only the kept try counts. Returns (step result, its predictor, scale)."""
    best = None
    for _ in range(12):
        trial_rng, trial_pred = copy.deepcopy(rng), copy.deepcopy(predictor)
        out = rep.step(cands, strategy, trial_pred, budget * scale, trial_rng, measured=measured)
        err = out.ledger.generated_tokens / max(target, 1) - 1
        if best is None or abs(err) < abs(best[3]):
            best = (out, trial_pred, trial_rng, err, scale)
        if abs(err) <= TOKEN_TOLERANCE:
            break
        scale *= target / max(out.ledger.generated_tokens, 1)
    out, trial_pred, trial_rng, _, scale = best
    rng.bit_generator.state = trial_rng.bit_generator.state
    return out, trial_pred, scale


def run_bench(source: BenchSource, strategies: Mapping[str, Strategy], *, progress: bool = False,
              say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every strategy of ``strategies`` on ``source``; returns JSON-ready results.

    Per repetition every arm sees the same candidate pools (common random numbers); the
    reference strategy (uniform) runs first so that, in token mode, the others can be
    matched to what it generated. Per repetition, metrics pool the measured steps
    (after ``warmup_steps``). ``say`` receives the no-contrast warnings as they happen.
    """
    import dataclasses

    from tqdm.auto import tqdm

    t_start = time.perf_counter()
    arms = source.arms(strategies)
    per_rep: dict[str, list[dict[str, Any]]] = {n: [] for n in arms}
    reference = "uniform" if "uniform" in arms else next(iter(arms))
    order = [reference] + [n for n in arms if n != reference]
    warnings: list[str] = []
    budget = source.nominal_budget
    bar = tqdm(total=source.repetitions * len(arms), desc=f"bench --{source.mode}", disable=not progress,
               leave=False, dynamic_ncols=True)
    for r in range(source.repetitions):
        rep = source.repetition(r)
        target_tokens: list[float] = []
        for name in order:
            arm = arms[name]
            predictor, rng = rep.predictor(arm), rep.rng(arm)
            ledger, measured, scale = BudgetLedger(), [], 1.0
            for step in range(source.steps):
                cands, counted = rep.candidates(step), step >= source.warmup_steps
                if source.budget_unit == "tokens" and name != reference:
                    out, predictor, scale = _token_matched_step(rep, cands, arm.strategy, predictor, budget, rng,
                                                                target_tokens[step], scale, counted)
                else:
                    out = rep.step(cands, arm.strategy, predictor, budget, rng, measured=counted)
                    if name == reference:
                        target_tokens.append(out.ledger.generated_tokens)
                if counted:
                    ledger = ledger.merge(out.ledger)
                    measured.append(out)
            trees = [t for out in measured for t in out.trees]
            warning = reward_warning(trees)
            if warning:
                warnings.append(f"{rep.label}, {name}: {warning}")
                if say is not None:
                    say(f"WARNING: {warnings[-1]}")
            per_rep[name].append(tree_metrics(trees, ledger, len(measured)) | {"budget_scale": scale}
                                 | rep.measure(arm, measured))
            rep.after_arm(arm, measured)
            bar.update(1)
    bar.close()
    results: dict[str, Any] = {"mode": source.mode, "config": dataclasses.asdict(source.config),
                               "nominal_budget": budget, "warnings": warnings,
                               "group_sized": group_sized(strategies),
                               "strategies": summarise({n: per_rep[n] for n in arms}, arms)}
    results |= source.results(strategies)
    results["checks"] = bench_checks(results)
    results["verdict"] = verdict(results)
    results["seconds"] = time.perf_counter() - t_start
    return results
