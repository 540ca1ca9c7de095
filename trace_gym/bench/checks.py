"""The verdict of a bench: paired differences on the headline metrics, checks, and the headline line.

Every comparison is *paired*: two arms of one repetition saw the same candidate pools
and the same recorded or simulated rollouts (common random numbers), so the
per-repetition differences carry the comparison. Their 95 % Student-t interval is cut
to the values the difference can take (a difference of two fractions lies in [-1, 1]),
and a strategy is *shown* better only when the interval excludes 0
(:func:`trace_gym.report.distinguishable`, with the exact sign test when every
difference is equal). Nothing here says PASS on noise:

- a check whose claim is shown says PASS; whose opposite is shown, FAIL; otherwise
  NOT SHOWN (with the interval); SKIP when a row is missing or the rows it reads found
  no contrast at all (every effective ratio 0: there is nothing to compare);
- the verdict line names each metric and says which way each went.

Headline metrics (:data:`HEADLINE`): the effective ratio (the paper's fraction of
selected prompts that are mixed, what PCL's fixed groups optimise), mixed prompts per
step (what TRACE's root objective maximises: the expected *number* of mixed groups) and
mixed groups per 1,000 generated tokens (the same per exact cost).

Roles, not names: the *baseline* (default ``uniform``) and the *method* (default
``trace``) are parameters (:class:`Roles`); every strategy is paired with both, and
``pairs`` adds any others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

#: Largest share of refused (``exhausted``) branches a rollout-bank bench gives a verdict with.
EXHAUSTED_LIMIT = 0.01
#: Relative tolerance of the token-budget check (per run).
TOKEN_CHECK_TOLERANCE = 0.02


#: What a check can say (the module docstring says when each).
Status = Literal["PASS", "FAIL", "NOT SHOWN", "SKIP"]


@dataclass(frozen=True)
class Check:
    """One check of a bench: a claim (``name``), what the bench showed of it (``status``) and the
    numbers behind that (``detail``). ``results["checks"]`` holds these; a bench's JSON holds
    each as ``{"name", "status", "detail"}`` (:meth:`to_json`, read back by :meth:`from_json`)."""

    name: str
    status: Status
    detail: str

    def __post_init__(self) -> None:
        if self.status not in ("PASS", "FAIL", "NOT SHOWN", "SKIP"):
            raise ValueError(f"a check's status is PASS, FAIL, NOT SHOWN or SKIP, got {self.status!r}")

    @property
    def failed(self) -> bool:
        """Whether the bench showed the opposite of the claim (``bench --strict`` exits 1)."""
        return self.status == "FAIL"

    def line(self) -> str:
        """The report's line: ``"STATUS: name (detail)"``."""
        return f"{self.status}: {self.name} ({self.detail})"

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> Check:
        """A check of a bench's JSON (``bench --json``)."""
        return cls(str(record["name"]), record["status"], str(record["detail"]))


@dataclass(frozen=True)
class Metric:
    """A headline metric: its row key, its label, and the range one arm's value can take."""

    key: str
    label: str
    low: float = 0.0
    high: float = math.inf


#: The headline metrics, in the order tables and the verdict state them.
HEADLINE: tuple[Metric, ...] = (
    Metric("effective_ratio", "effective ratio", 0.0, 1.0),
    Metric("mixed_prompts", "mixed prompts/step"),
    Metric("mixed_per_1k_tokens", "mixed/1k tok"),
)
METRICS = {m.key: m for m in HEADLINE}


@dataclass(frozen=True)
class Roles:
    """Who is compared with whom.

    Attributes:
        baseline: every strategy is paired with it (``bench --baseline``).
        method: the strategy the checks and the verdict are about; every strategy is also
            paired with it.
        pairs: more ``(a, b)`` pairs (``bench --pairs a:b,...``).
    """

    baseline: str = "uniform"
    method: str = "trace"
    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse_pairs(cls, text: str) -> tuple[tuple[str, str], ...]:
        """``"a:b,c:d"`` -> ``(("a", "b"), ("c", "d"))``; ValueError naming a bad item."""
        out = []
        for item in (x.strip() for x in text.split(",") if x.strip()):
            a, sep, b = item.partition(":")
            if not sep or not a.strip() or not b.strip() or a.strip() == b.strip():
                raise ValueError(f"--pairs: expected NAME:OTHER (two different strategies), got {item!r}")
            out.append((a.strip(), b.strip()))
        return tuple(out)


def headline_rows(results: Mapping[str, Any]) -> dict[str, Any]:
    """The rows a verdict may read: every arm but the upper bounds."""
    return {n: v for n, v in results["strategies"].items() if not v["upper_bound"]}


# ---------------------------------------------------------------------- paired differences
def paired(rows: Mapping[str, Any], a: str, b: str, metric: Metric, scale: float = 1.0) -> dict[str, Any]:
    """The paired difference ``a - scale * b`` of ``metric`` over repetitions.

    Returns ``{"a", "b", "metric", "mean_a", "mean_b", "difference", "low", "high", "n",
    "shown"}``: ``shown`` is +1 (a above), -1 (below) or 0 (not shown, or fewer than 2
    pairs), and ``note`` says why when the interval is degenerate.
    """
    from trace_gym import report

    ra, rb = rows[a]["per_rep"], rows[b]["per_rep"]
    xa = [float(r[metric.key]) for r in ra]
    xb = [float(r[metric.key]) for r in rb]
    mean, half, n = report.paired_difference(xa, [scale * x for x in xb])
    span = metric.high - scale * metric.low, metric.low - scale * metric.high  # a in [lo, hi], b in [lo, hi]
    low, high = report.bounded_interval(mean, half, span[1], span[0])
    shown = int(math.copysign(1, mean)) if n >= 2 and report.distinguishable(mean, half, n) else 0
    note = ("one repetition: no interval" if n < 2 else
            "all differences equal: no spread, judged by the exact sign test" if half == 0 else "")
    return {"a": a, "b": b, "metric": metric.key, "scale": scale, "mean_a": rows[a][metric.key],
            "mean_b": rows[b][metric.key], "difference": mean, "low": low, "high": high, "n": n,
            "shown": shown, "note": note}


def interval_text(p: Mapping[str, Any], digits: int = 3) -> str:
    """``+0.234 [0.108, 0.360] (95 %, 10 paired repetitions)``, or what stands in for the interval."""
    if p["n"] < 2:
        return f"{p['difference']:+.{digits}f} ({p['note']})"
    if p["note"]:
        return f"{p['difference']:+.{digits}f} ({p['note']}, {p['n']} paired repetitions)"
    return (f"{p['difference']:+.{digits}f} [{p['low']:+.{digits}f}, {p['high']:+.{digits}f}] "
            f"(95 %, {p['n']} paired repetitions)")


def pair_list(rows: Mapping[str, Any], roles: Roles) -> list[tuple[str, str]]:
    """Every strategy against the baseline, then against the method, then ``roles.pairs``;
    each unordered pair once, pairs naming a missing row dropped."""
    out: list[tuple[str, str]] = []
    seen: set[frozenset] = set()
    wanted = [(n, roles.baseline) for n in rows] + [(n, roles.method) for n in rows] + list(roles.pairs)
    for a, b in wanted:
        if a == b or a not in rows or b not in rows or frozenset((a, b)) in seen:
            continue
        seen.add(frozenset((a, b)))
        out.append((a, b))
    return out


def paired_table(results: Mapping[str, Any], roles: Roles) -> list[dict[str, Any]]:
    """One entry per pair of :func:`pair_list`: ``{"a", "b", "<metric key>": paired(...), ...,
    "identical": why the two rows are the same in every repetition, or None}``."""
    rows = headline_rows(results)
    table = []
    for a, b in pair_list(rows, roles):
        entry: dict[str, Any] = {"a": a, "b": b, "identical": identical_rows(rows, a, b)}
        for metric in HEADLINE:
            entry[metric.key] = None if no_contrast({a: rows[a], b: rows[b]}) else paired(rows, a, b, metric)
        table.append(entry)
    return table


def identical_rows(rows: Mapping[str, Any], a: str, b: str) -> str | None:
    """Why rows ``a`` and ``b`` agree in every repetition on every headline metric, or ``None``."""
    ra, rb = rows[a]["per_rep"], rows[b]["per_rep"]
    if len(ra) != len(rb) or any(x.get(m.key) != y.get(m.key) for x, y in zip(ra, rb) for m in HEADLINE):
        return None
    spreads = [s.get("value_spread", math.nan) for r in ra + rb for s in r.get("by_step", [])]
    if spreads and max(spreads) <= 1e-9:
        return (f"{a} and {b} gave identical results in every repetition: the predictor's values were all "
                "equal, so selection by value fell back to the candidates' order")
    return (f"{a} and {b} gave identical results in every repetition: they chose the same prompts and "
            "rollouts (e.g. the same group size over the same ranking)")


# ---------------------------------------------------------------------- checks
def no_contrast(rows: Mapping[str, Any]) -> bool:
    """Whether comparing ``rows`` is degenerate: none of them found a mixed prompt in any
    repetition (every effective ratio 0, or NaN where a repetition gave no prompt a rollout)."""
    return bool(rows) and not any(r["effective_ratio"] > 0 or any(x["effective_ratio"] > 0 for x in r["per_rep"])
                                  for r in rows.values())


def _skip(rows: Mapping[str, Any], needs: Sequence[str], no_verdict: bool) -> str | None:
    missing = [n for n in needs if n not in rows]
    if missing:
        return f"needs {', '.join(missing)}"
    if no_verdict:
        return "no verdict: the bank ran out (see above)"
    if no_contrast({n: rows[n] for n in needs}):
        return (f"no contrast: {', '.join(needs)} found no mixed prompt in any repetition (every rollout of a "
                "prompt had the same outcome), so there is nothing to compare")
    return None


def above_check(rows: Mapping[str, Any], a: str, b: str, metric: Metric, no_verdict: bool,
                scale: float = 1.0, claim: str = "") -> Check:
    """The claim "``a`` above ``scale`` x ``b`` on ``metric``": PASS only when the paired interval
    shows it, FAIL when it shows the opposite, NOT SHOWN otherwise, SKIP when degenerate."""
    name = claim or f"{a} {metric.label} above {b}"
    skip = _skip(rows, (a, b), no_verdict)
    if skip is None and scale != 1.0 and no_contrast({b: rows[b]}):
        skip = f"no contrast: {b} found no mixed prompt in any repetition, so a ratio to it is undefined"
    if skip is not None:
        return Check(name, "SKIP", skip)
    p = paired(rows, a, b, metric, scale)
    status = {1: "PASS", -1: "FAIL", 0: "NOT SHOWN"}[p["shown"]]
    what = f"{a} - {scale:g} x {b}" if scale != 1.0 else "difference"
    return Check(name, status, f"{p['mean_a']:.3f} vs {p['mean_b']:.3f}; {what} {interval_text(p)}")


def between_check(rows: Mapping[str, Any], low: str, mid: str, high: str, metric: Metric,
                  no_verdict: bool) -> Check:
    """The claim ``low < mid < high`` on ``metric``: PASS only when both paired differences are shown."""
    name = f"{mid} {metric.label} between {low} and {high}"
    skip = _skip(rows, (low, mid, high), no_verdict)
    if skip is not None:
        return Check(name, "SKIP", skip)
    up, down = paired(rows, mid, low, metric), paired(rows, high, mid, metric)
    status = ("PASS" if up["shown"] == 1 and down["shown"] == 1 else
              "FAIL" if up["shown"] == -1 or down["shown"] == -1 else "NOT SHOWN")
    return Check(name, status,
                 f"{rows[low][metric.key]:.3f} < {rows[mid][metric.key]:.3f} < {rows[high][metric.key]:.3f}; "
                 f"{mid} - {low} {interval_text(up)}, {high} - {mid} {interval_text(down)}")


def bench_checks(results: Mapping[str, Any], roles: Roles = Roles()) -> list[Check]:
    """The checks, on the headline rows: the bank guard (:func:`exhaustion_check`), the method
    above the baseline on every headline metric, the paper's ">= 2x" on the effective ratio,
    the method above every other strategy on the effective ratio and mixed prompts per step,
    its two ablations between the baseline and it, and the equal-budget check (costs, not
    outcomes: it holds whatever the rewards)."""
    rows = headline_rows(results)
    checks: list[Check] = []
    guard = exhaustion_check(results)
    if guard is not None:
        checks.append(guard)
    no_verdict = guard is not None and guard.failed
    method, base = roles.method, roles.baseline
    for metric in HEADLINE:
        checks.append(above_check(rows, method, base, metric, no_verdict))
    if method == "trace":  # the paper's claim is about TRACE, not whichever arm is the method
        checks.append(above_check(rows, method, base, METRICS["effective_ratio"], no_verdict, scale=2.0,
                                  claim=f"{method} effective ratio >= 2x {base} (paper, learned predictor: "
                                        "60.6 / 26.8 = 2.26x)"))
    for other in rows:
        if other not in (method, base) and not other.startswith(f"{method}_"):
            for key in ("effective_ratio", "mixed_prompts"):
                checks.append(above_check(rows, method, other, METRICS[key], no_verdict))
    for ablation in (f"{method}_root_only", f"{method}_prefix_only"):
        if ablation in rows:
            checks.append(between_check(rows, base, ablation, method, METRICS["effective_ratio"], no_verdict))
    checks.append(budget_check(results, rows, base))
    return checks


def budget_check(results: Mapping[str, Any], rows: Mapping[str, Any], baseline: str = "uniform") -> Check:
    """Every strategy (upper bounds included) spent the same budget per step: the nominal one
    (a strategy that acts in waves may stop below it by its own rule, never above), or in
    token mode generated tokens within :data:`TOKEN_CHECK_TOLERANCE` of the baseline's."""
    everyone = list(results["strategies"].values())
    if results["config"].get("budget_unit", "nominal") == "tokens":
        name = f"equal generated tokens (every strategy within 2 % of {baseline}'s)"
        if not rows:
            return Check(name, "SKIP", "no strategy ran")
        reference = rows.get(baseline, everyone[0])["generated_tokens"]
        worst = max(abs(v["generated_tokens"] / max(reference, 1) - 1) for v in everyone)
        return Check(name, "PASS" if worst <= TOKEN_CHECK_TOLERANCE else "FAIL",
                     f"per step: {reference:,.0f} tokens; largest deviation {100 * worst:.2f} %")
    name = "equal nominal budget"
    if not rows:
        return Check(name, "SKIP", "no strategy ran")
    budget = results["nominal_budget"]
    costs = {n: v["nominal_cost"] for n, v in results["strategies"].items()}
    waves = {n for n, v in results["strategies"].items() if v.get("acts_in_waves")}
    over = {n: c for n, c in costs.items() if c > budget * (1 + 1e-9) or (c < budget * (1 - 1e-9) and n not in waves)}
    under = {n: c for n, c in costs.items() if c < budget * (1 - 1e-9) and n in waves}
    detail = f"per step: {sorted(set(round(c, 6) for c in costs.values()))} (budget {budget:g})"
    if under:
        detail += "; below it by their own rule: " + ", ".join(f"{n} {c:.3g}" for n, c in sorted(under.items()))
    if over:
        detail += "; not equal to it: " + ", ".join(f"{n} {c:.3g}" for n, c in sorted(over.items()))
    return Check(name, "FAIL" if over else "PASS", detail)


# ---------------------------------------------------------------------- the headline line
def verdict(results: Mapping[str, Any], roles: Roles = Roles()) -> str:
    """The headline line: the method against the baseline on the effective ratio and on mixed
    prompts per step, each by its paired interval, stated plainly whichever way it goes;
    "NO VERDICT" when the bank ran out or neither found a mixed prompt."""
    rows, method, base = headline_rows(results), roles.method, roles.baseline
    if method not in rows or base not in rows:
        return f"no verdict: the {method}-vs-{base} headline needs both strategies in the run"
    guard = exhaustion_check(results)
    if guard is not None and guard.failed:
        detail = guard.detail
        return detail if detail.startswith("NO VERDICT") else f"NO VERDICT: {detail}"
    if no_contrast({n: rows[n] for n in (method, base)}):
        from trace_gym.step.learning import knob_hint

        return (f"NO VERDICT: no contrast (neither {method} nor {base} found a mixed prompt; every rollout of a "
                f"prompt agreed){knob_hint(results.get('difficulty_knobs'))}")
    parts = [paired(rows, method, base, METRICS[k]) for k in ("effective_ratio", "mixed_prompts")]
    if parts[0]["n"] < 2:
        return (f"{method} and {base} cannot be told apart from one repetition (effective ratio "
                f"{parts[0]['mean_a']:.3f} vs {parts[0]['mean_b']:.3f})")
    words = {1: f"{method} beats {base}", -1: f"{method} is WORSE than {base}",
             0: f"{method} and {base} cannot be told apart"}

    def said(p: Mapping[str, Any]) -> str:
        ratio = f"{p['mean_a'] / p['mean_b']:.2f}x; " if p["mean_b"] > 0 else ""
        return (f"{METRICS[p['metric']].label} {p['mean_a']:.3f} vs {p['mean_b']:.3f} ({ratio}difference "
                f"{interval_text(p)})")

    if parts[0]["shown"] == parts[1]["shown"]:
        head = f"{words[parts[0]['shown']]} on both headline metrics"
    else:
        head = "; ".join(f"{words[p['shown']]} on {METRICS[p['metric']].label}" for p in parts)
    return f"{head}: {said(parts[0])}; {said(parts[1])}; predictor {rows[method]['predictor']}"


def exhaustion_check(results: Mapping[str, Any]) -> Check | None:
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
        return Check(name, "PASS", f"largest exhausted share {100 * worst:.2f} %; {have}{note}")
    roots = max(int(r.get("roots_needed", 0)) for v in rows.values() for r in v["per_rep"])
    conts = max(int(r.get("continuations_needed", 0)) for v in rows.values() for r in v["per_rep"])
    shares = ", ".join(f"{n} {100 * x:.1f} %" for n, x in sorted(over.items(), key=lambda kv: -kv[1]))
    return Check(name, "FAIL",
                 f"NO VERDICT: exhausted share {shares}; this bench needs a bank with at least {roots} roots per "
                 f"prompt and {conts} continuations per recorded prefix ({have}); record a larger bank or lower "
                 "the budget, the steps or the group size")


def first_repetitions(results: Mapping[str, Any], n: int, start: int = 0) -> dict[str, Any]:
    """``results`` (a bench's JSON) with every row cut to ``n`` repetitions from ``start`` (``per_rep``;
    default its first ``n``), the headline metrics re-averaged over them (what a run of ``n``
    repetitions would have printed)."""
    from trace_gym import report

    rows = {}
    for name, row in results["strategies"].items():
        reps = row["per_rep"][start:start + n]
        cut = {**row, "per_rep": reps, "repetitions": len(reps)}
        for key in ("effective_ratio", "mixed_prompts", "mixed_per_1k_tokens"):
            cut[key], cut[key + "_ci"], _ = report.mean_ci([float(r[key]) for r in reps])
        rows[name] = cut
    return {**results, "strategies": rows}


def repetition_blocks(results: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """``results`` cut into its disjoint blocks of ``n`` repetitions (as many whole blocks as it ran, at
    least one): each what a run of ``n`` repetitions would have printed. A verdict word read in each
    block is the word at the power of ``n`` repetitions, drawn once per block."""
    count = min(len(r["per_rep"]) for r in results["strategies"].values())
    return [first_repetitions(results, n, start) for start in range(0, max(count - n, 0) + 1, n)]


def modal_word(words: Sequence[str]) -> str:
    """The word more than half of ``words`` say, else ``split`` (which matches no other word)."""
    top = max(set(words), key=list(words).count)
    return top if 2 * list(words).count(top) > len(words) else "split"
