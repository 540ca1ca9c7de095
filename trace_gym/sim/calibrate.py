"""Calibrating the simulator to real outcomes (a rollout bank's counts): pure functions.

The simulator (:mod:`trace_gym.sim.simulator`) has three knobs a bank can measure:

- **the difficulty prior** p ~ Beta(a, b): from each prompt's successes s_i among R_i
  recorded roots, by the beta-binomial method of moments. With mean mu = mean(s_i / R_i)
  and the observed variance of s_i / R_i,

      Var(s / R) = mu (1 - mu) (1 + (R - 1) rho) / R,   rho = 1 / (a + b + 1),

  so rho, then a + b = 1 / rho - 1 (:func:`beta_from_counts`). The simulator takes the
  prior as ``mean_success`` and ``target_mixed`` = P(a group of G fresh roots is mixed)
  (:func:`trace_gym.sim.simulator.mixed_probability` of that Beta).
- **how outcome variance resolves over turns**, kappa (``step_concentration``): under the
  beta-splitting martingale E[V_{t+1} (1 - V_{t+1}) | V_t] = V_t (1 - V_t) kappa / (kappa + 1),
  and a continuation from a prefix at depth t flips the observed outcome of the root
  through it with probability E[2 V_t (1 - V_t)] (the two outcomes are independent
  draws given V_t), so

      flip(t) = 2 E[p (1 - p)] r^t,   r = kappa / (kappa + 1),   E[p (1 - p)] = mu (1 - mu) (a + b) / (a + b + 1).

  r is the maximum-likelihood fit of the flip counts by depth (binomial per depth; a
  bounded 1-D search), kappa = r / (1 - r) (:func:`concentration_from_flips`). Where episode
  lengths go with the outcome (per-episode lengths, :mod:`trace_gym.sim.lengths`), reaching a
  depth says something about the outcome too, so r is fitted under the length model instead
  (:func:`concentration_under_lengths`, :func:`with_lengths`).
- **predictor informativeness** (``feature_spearman``): here, the learned predictor's measured
  prompt-level Spearman against the bank's empirical rates, when it was measured (a lower
  bound of what the knob means). ``bench --sim calibrate_from=BANK`` then replaces it, and
  sets ``predictor_level_shift``, by fitting what selection reads
  (:func:`trace_gym.bench.sim_fit.fit_predictor`): a Spearman match alone left the simulated
  predictor picking far worse than the bank's.

Episode lengths (``min_turns``, ``max_turns``) come from the recorded roots' depths; with a bank
at hand, ``bench --sim calibrate_from=BANK`` also sets each length's share among the failed and
among the successful roots (``turn_shares``, ``success_turn_shares``:
:func:`trace_gym.bench.sim_calibration.lengths_by_outcome`), so each simulated episode draws its own length
given its outcome (:mod:`trace_gym.sim.lengths`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.sim.lengths import LengthModel, reached_value

#: Bounds of the fitted Beta concentration a + b (a fit outside them is clipped, and
#: :func:`calibration` says so in ``fitted["clipped"]``).
CONCENTRATION_BOUNDS = (1e-3, 1e6)


def beta_from_counts(successes: Sequence[int], totals: Sequence[int]) -> tuple[float, float]:
    """Beta(a, b) of the prompt success probability from per-prompt counts (method of moments).

    Args:
        successes: s_i, successes among the recorded roots of prompt i.
        totals: R_i, recorded roots of prompt i (>= 2; the mean R is used when they differ).

    Raises:
        ValueError: fewer than two prompts, a total below 2, s_i outside [0, R_i], or every
            prompt at the same extreme (all 0 or all 1: no prior can be fitted).
    """
    s, n = np.asarray(successes, dtype=float), np.asarray(totals, dtype=float)
    if s.shape != n.shape or s.size < 2:
        raise ValueError(f"need counts of at least two prompts (same length), got {s.size} and {n.size}")
    if (n < 2).any() or (s < 0).any() or (s > n).any():
        raise ValueError("every prompt needs >= 2 recorded roots and 0 <= successes <= roots")
    rate = s / n
    mu = float(rate.mean())
    if mu <= 0 or mu >= 1:
        raise ValueError(f"every recorded root {'failed' if mu <= 0 else 'succeeded'}: no difficulty prior can be "
                         "fitted (the bank has no contrast)")
    r = float(n.mean())
    rho = (r * float(rate.var(ddof=1)) / (mu * (1 - mu)) - 1) / (r - 1)
    lo, hi = CONCENTRATION_BOUNDS
    conc = hi if rho <= 1 / (hi + 1) else lo if rho >= 1 / (lo + 1) else 1 / rho - 1
    return mu * conc, (1 - mu) * conc


def concentration_from_flips(depths: Sequence[int], flips: Sequence[int], trials: Sequence[int],
                             prior: tuple[float, float]) -> float:
    """kappa of the martingale from flip counts by prefix depth (see the module docstring).

    Args:
        depths: prefix depths t >= 1.
        flips: continuations from depth t whose outcome differs from the root's.
        trials: continuations from depth t.
        prior: the difficulty prior (a, b), e.g. from :func:`beta_from_counts`, or task types
            ((share, a, b), ...) (:mod:`trace_gym.sim.prior`).

    Returns:
        kappa > 0 (large: a turn reveals little; small: the outcome is settled early).
    """
    from scipy.optimize import minimize_scalar

    t, f, n = (np.asarray(x, dtype=float) for x in (depths, flips, trials))
    keep = n > 0
    t, f, n = t[keep], f[keep], n[keep]
    if t.size == 0:
        raise ValueError("no continuations were recorded: nothing to fit")
    if (t < 1).any() or (f < 0).any() or (f > n).any():
        raise ValueError("depths must be >= 1 and 0 <= flips <= trials")
    from trace_gym.sim.prior import components_of, mean_variance_term

    base = 2 * mean_variance_term(components_of(prior))  # 2 E[p (1 - p)]

    def nll(r: float) -> float:
        q = np.clip(base * r**t, 1e-12, 1 - 1e-12)
        return -float((f * np.log(q) + (n - f) * np.log1p(-q)).sum())

    fit = minimize_scalar(nll, bounds=(1e-6, 1 - 1e-9), method="bounded", options={"xatol": 1e-10})
    r = float(fit.x)
    return r / (1 - r)


def flips_under_lengths(r: float, depths: Sequence[int], prior: tuple, lengths: LengthModel,
                        kept: Mapping[int, Sequence[int]], samples: int = 20_000, seed: int = 0) -> np.ndarray:
    """P(a continuation from a recorded prefix at each of ``depths`` flips its root's outcome), with
    per-turn variance ratio ``r`` (kappa = r / (1 - r)) and episode lengths that go with the outcome
    (``lengths``, a :class:`~trace_gym.sim.lengths.LengthModel`), for prefixes recorded as a bank
    records them (``kept``: a root of L turns -> the depths it keeps).

    Given V_t, the root's outcome and length are drawn jointly (P(y, L | V_t) = V_t^y (1 - V_t)^(1 - y)
    h_y(L)) and a continuation's outcome is Bernoulli(W_t) (W_t = P(y = 1 | V_t, L > t)), so

        flip(t) = E[sum_{L kept t} (1 - V) h_0(L) W + V h_1(L) (1 - W)] / E[sum_{L kept t} (1 - V) h_0(L) + V h_1(L)],

    the expectation over V_t (p from ``prior``, a Beta (a, b) or task types, at ``samples`` quantiles
    (:func:`trace_gym.sim.prior.quantiles`), then t beta steps drawn by
    inverse CDF from uniforms fixed by ``seed``: common random numbers, so the rates are smooth in
    r). A depth no root can keep gets NaN."""
    from scipy import special

    from trace_gym.sim.prior import components_of, quantiles

    kappa = r / (1 - r)
    v = quantiles(components_of(prior), samples)
    wins = lengths.success_shares(v)  # each sample's own successful lengths (one row each without a tilt)
    turns = lengths.min_turns + np.arange(len(lengths.failure))
    uniforms = np.random.default_rng(seed).random((max(depths, default=0), v.size))
    out, by_depth = [], {}
    for t in range(1, max(depths, default=0) + 1):
        inner = (kappa * v > 0) & (kappa * (1 - v) > 0)  # a value whose a or b underflows is settled
        v = v.copy()
        v[inner] = special.betaincinv(kappa * v[inner], kappa * (1 - v[inner]), uniforms[t - 1, inner])
        by_depth[t] = v
    for t in depths:
        v = by_depth[t]
        w = reached_value(v, lengths.failure[turns > t].sum(), wins[:, turns > t].sum(axis=1))
        keeps = np.array([L > t and t in kept.get(int(L), ()) for L in turns])
        h0, h1 = lengths.failure[keeps].sum(), wins[:, keeps].sum(axis=1)
        den = float(np.mean((1 - v) * h0 + v * h1))
        out.append(float(np.mean((1 - v) * h0 * w + v * h1 * (1 - w))) / den if den > 0 else float("nan"))
    return np.asarray(out)


def concentration_under_lengths(depths: Sequence[int], flips: Sequence[int], trials: Sequence[int],
                                prior: tuple, lengths: LengthModel,
                                kept: Mapping[int, Sequence[int]]) -> float:
    """kappa from flip counts by prefix depth when episode lengths go with the outcome: the
    maximum-likelihood r of :func:`flips_under_lengths` (binomial per depth; a bounded 1-D search),
    kappa = r / (1 - r). :func:`concentration_from_flips` reads every flip as the value path's own
    resolution; where an episode's length says something about its outcome, reaching a depth
    resolves part of it too, and that fit overstates how much one turn reveals (the guessing bank:
    kappa 1.59, whose simulated flips are 0.09 / 0.44 / 0.01 at depths 1 / 2 / 3 against the bank's
    0.14 / 0.88 / 0.03)."""
    from scipy.optimize import minimize_scalar

    t, f, n = (np.asarray(x, dtype=float) for x in (depths, flips, trials))
    keep = n > 0
    t, f, n = t[keep].astype(int), f[keep], n[keep]
    if t.size == 0:
        raise ValueError("no continuations were recorded: nothing to fit")

    def nll(r: float) -> float:
        q = np.clip(np.nan_to_num(flips_under_lengths(r, t.tolist(), prior, lengths, kept), nan=0.5), 1e-12,
                    1 - 1e-12)
        return -float((f * np.log(q) + (n - f) * np.log1p(-q)).sum())

    fit = minimize_scalar(nll, bounds=(1e-4, 1 - 1e-6), method="bounded", options={"xatol": 1e-6})
    r = float(fit.x)
    return r / (1 - r)


def calibration(prompt_successes: Sequence[int], prompt_roots: Sequence[int], flip_depths: Sequence[int],
                flip_counts: Sequence[int], flip_trials: Sequence[int], root_turns: Sequence[int], *,
                group_size: int, learned_spearman: float | None = None,
                kinds: Sequence[str] | None = None) -> dict[str, Any]:
    """The simulator settings a bank's counts imply: ``{"mean_success", "target_mixed",
    "step_concentration", "min_turns", "max_turns"}`` plus ``feature_spearman`` when
    ``learned_spearman`` is given (and positive), task types (``type_shares``, ``type_means``,
    ``type_concentrations``) where ``kinds`` (one task kind per prompt) name two or more that explain the
    counts (:func:`trace_gym.sim.prior.types_from_kinds`; kappa is then fitted under them), and ``"fitted"``
    with the fit's intermediate values (a, b, r, the prior, the kinds) for the report."""
    from trace_gym.sim.prior import mixed_probability, mixed_share, types_from_kinds

    a, b = beta_from_counts(prompt_successes, prompt_roots)
    typed = types_from_kinds(kinds, prompt_successes, prompt_roots) if kinds is not None else None
    prior, names, bic = typed if typed is not None else (((1.0, a, b),), (), None)
    kappa = concentration_from_flips(flip_depths, flip_counts, flip_trials, prior) if len(flip_depths) else None
    turns = np.asarray(root_turns, dtype=int)
    mu = a / (a + b)
    ceiling = 1 - mu**group_size - (1 - mu) ** group_size  # the simulator's prior needs target < ceiling
    out: dict[str, Any] = {"mean_success": mu,
                           "target_mixed": min(mixed_probability(a, b, group_size), ceiling * (1 - 1e-6))}
    if kappa is not None:
        out["step_concentration"] = float(np.clip(kappa, 1e-3, 1e6))
    if turns.size:
        out["min_turns"], out["max_turns"] = max(1, int(turns.min())), max(1, int(turns.max()))
    if learned_spearman is not None and math.isfinite(learned_spearman) and learned_spearman > 0:
        out["feature_spearman"] = float(min(learned_spearman, 1.0))
    if len(prior) > 1:  # the bank's prompts are of several kinds
        out["type_shares"] = tuple(w for w, _, _ in prior)
        out["type_means"] = tuple(x / (x + y) for _, x, y in prior)
        out["type_concentrations"] = tuple(x + y for _, x, y in prior)
    lo, hi = CONCENTRATION_BOUNDS
    out["fitted"] = {"a": a, "b": b, "concentration": a + b,
                     "r": None if kappa is None else kappa / (kappa + 1),
                     "clipped": bool(np.isclose(a + b, lo) or np.isclose(a + b, hi)),
                     "prior": [list(c) for c in prior], "kinds": list(names), "kinds_bic": bic,
                     "types_mixed": mixed_share(prior, group_size)}
    return out


def calibration_from_stats(stats: Mapping[str, Any], *, group_size: int) -> dict[str, Any]:
    """:func:`calibration` of a bank's :func:`~trace_gym.banks.stats.bank_stats` (prompt counts,
    flips at depth >= 1, root turn histogram, the learned predictor's prompt Spearman when measured)."""
    counts = np.asarray(stats["prompt_counts"], dtype=int).reshape(-1, 2)
    depths, flipped, trials = flip_counts(stats)
    turns = [int(t) for t, c in stats["turns"]["histogram"].items() for _ in range(int(c))]
    learned = (stats.get("predictor") or {}).get("prompt")
    usable = counts[:, 1] >= 2
    kinds = stats.get("prompt_kinds")
    kinds = None if kinds is None else [k for k, keep in zip(kinds, usable) if keep]
    return calibration(counts[usable, 0], counts[usable, 1], depths, flipped, trials, turns, group_size=group_size,
                       learned_spearman=learned, kinds=kinds)


def flip_counts(stats: Mapping[str, Any]) -> tuple[list[int], list[int], list[int]]:
    """``(depths, flips, continuations)`` at each prefix depth >= 1 of a bank's
    :func:`~trace_gym.banks.stats.bank_stats`."""
    flips = {int(d): v for d, v in stats["flip_by_depth"].items() if int(d) >= 1 and v["continuations"]}
    depths = sorted(flips)
    trials = [int(flips[d]["continuations"]) for d in depths]
    return depths, [int(round(flips[d]["flip"] * n)) for d, n in zip(depths, trials)], trials


def with_lengths(calibrated: Mapping[str, Any], stats: Mapping[str, Any], shares: Mapping[str, Sequence[float]],
                 kept: Mapping[int, Sequence[int]], counts: np.ndarray | None = None) -> dict[str, Any]:
    """A :func:`calibration_from_stats` result with per-episode lengths by outcome (``shares``:
    ``turn_shares`` and ``success_turn_shares`` over ``min_turns..max_turns``) and kappa refitted
    under them (:func:`concentration_under_lengths`; ``kept``: a root of L turns -> the prefix
    depths the bank records). With ``counts`` (each prompt's roots by outcome and length, shape
    (prompts, 2, lengths)), the successful lengths may move with the prompt's p: :func:`success_tilt`,
    kept (``success_turn_tilt`` and its ``success_turn_shares``) where BIC pays for it; ``fitted["tilt"]``
    records the fit either way. ``fitted`` keeps the fit without lengths as ``r_without_lengths``."""
    out = dict(calibrated) | {k: tuple(v) for k, v in shares.items()}
    depths, flipped, trials = flip_counts(stats)
    if not shares or "step_concentration" not in out or not depths:
        return out
    fitted = out["fitted"]
    prior = tuple(tuple(c) for c in fitted.get("prior") or [(1.0, fitted["a"], fitted["b"])])
    if counts is not None:  # successful lengths that may move with the prompt's p
        tilt = success_tilt(counts, prior, out["mean_success"])
        fitted = {**fitted, "tilt": tilt}
        if tilt["kept"]:
            out["success_turn_shares"], out["success_turn_tilt"] = tuple(tilt["shares"]), tilt["tilt"]
    model = LengthModel.of(out["min_turns"], out["max_turns"], out["turn_shares"], out["success_turn_shares"],
                           out.get("success_turn_tilt", 0.0), out["mean_success"])
    kappa = float(np.clip(concentration_under_lengths(depths, flipped, trials, prior, model, kept), 1e-3, 1e6))
    out["step_concentration"] = kappa
    out["fitted"] = {**fitted, "r": kappa / (kappa + 1), "r_without_lengths": fitted["r"]}
    if out.get("type_shares") and fitted.get("kinds"):
        out["type_step_concentrations"] = type_kappas(stats.get("flip_counts_by_kind") or {}, fitted["kinds"],
                                                      prior, model, kept, kappa)
    return out


#: Quantiles of the prior over which :func:`success_tilt` integrates each prompt's unknown p (2,000 gave the
#: guessing bank's tilt to within 1e-3 of these).
TILT_SAMPLES = 400
#: :func:`success_tilt`'s largest |gamma|: where each prompt's successes all end at one length that its
#: difficulty decides, the likelihood rises without end; at 20 a task one logit from the pivot already
#: weighs the next length by exp(-20).
TILT_BOUND = 20.0


def success_tilt(counts: np.ndarray, prior: tuple, pivot: float, samples: int = TILT_SAMPLES) -> dict[str, Any]:
    """The maximum-likelihood success lengths under a tilt (:mod:`trace_gym.sim.lengths`): the histogram
    s at p = ``pivot`` and gamma in P(L = l | y = 1, p) ∝ s_l exp(-gamma (l - min) (logit p - logit pivot)).

    ``counts``: shape (prompts, 2, lengths), each prompt's roots by outcome (failed, successful) and length.
    A prompt's likelihood integrates its unknown p over ``prior`` (Beta components; ``samples``
    quantiles): E_p[p^wins (1 - p)^fails prod_l s_l(p)^(wins of length l)] (the failed lengths do not
    depend on p and drop out). At gamma = 0 the maximum is the successful roots' own histogram. Returns
    ``{"shares", "tilt", "gain", "threshold", "kept"}``: the fitted s and gamma, twice the log-likelihood
    gain over gamma = 0, log(prompts) (BIC's price of one parameter), and whether the gain pays it
    (if not, ``shares`` is the roots' histogram and ``tilt`` 0). gamma is bounded by :data:`TILT_BOUND`."""
    from scipy import optimize, special

    from trace_gym.sim.prior import components_of, quantiles

    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 3 or counts.shape[1] != 2 or (counts < 0).any():
        raise ValueError(f"counts must have shape (prompts, 2, lengths) of counts >= 0, got shape {counts.shape}")
    wins = counts[:, 1]  # (prompts, lengths)
    seen = np.flatnonzero(wins.sum(axis=0) > 0)  # lengths some success had: the only ones with mass
    empirical = wins.sum(axis=0) / max(wins.sum(), 1.0)
    if len(seen) < 2:  # one successful length (or none): nothing a tilt can move
        return {"shares": tuple(float(x) for x in empirical), "tilt": 0.0, "gain": 0.0,
                "threshold": float(np.log(max(len(counts), 1))), "kept": False}
    p = np.clip(quantiles(components_of(prior), samples), 1e-12, 1 - 1e-12)
    base_ll = counts[:, 1].sum(1)[:, None] * np.log(p)[None, :] + counts[:, 0].sum(1)[:, None] * np.log1p(-p)[None, :]
    steps = seen.astype(float)
    x = np.log(p / (1 - p)) - np.log(pivot / (1 - pivot))

    def nll(theta: np.ndarray) -> float:
        log_s = np.concatenate([[0.0], theta[:-1]])[None, :] - theta[-1] * steps[None, :] * x[:, None]
        log_s -= special.logsumexp(log_s, axis=1, keepdims=True)  # (samples, seen lengths)
        ll = base_ll + wins[:, seen] @ log_s.T
        return -float((special.logsumexp(ll, axis=1) - np.log(len(p))).sum())

    start = np.log(empirical[seen][1:] / empirical[seen][0])
    null = nll(np.concatenate([start, [0.0]]))
    bounds = [(None, None)] * len(start) + [(-TILT_BOUND, TILT_BOUND)]
    fit = optimize.minimize(nll, np.concatenate([start, [0.0]]), method="Nelder-Mead", bounds=bounds,
                            options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 4000 * len(seen)})
    gain, threshold = 2 * (null - float(fit.fun)), float(np.log(len(counts)))
    if not gain > threshold:
        return {"shares": tuple(float(x) for x in empirical), "tilt": 0.0, "gain": max(gain, 0.0),
                "threshold": threshold, "kept": False}
    shares = np.zeros(counts.shape[2])
    shares[seen] = np.exp(np.concatenate([[0.0], fit.x[:-1]]))
    return {"shares": tuple(float(x) for x in shares / shares.sum()), "tilt": float(fit.x[-1]), "gain": gain,
            "threshold": threshold, "kept": True}


def type_kappas(counts: Mapping[str, Mapping[str, Sequence[int]]], kinds: Sequence[str], prior: tuple,
                lengths: LengthModel, kept: Mapping[int, Sequence[int]], fallback: float) -> tuple[float, ...]:
    """Each task type's own kappa: :func:`concentration_under_lengths` over the continuations of its kind
    alone (``counts``: kind -> depth -> [flips, continuations], :func:`trace_gym.banks.stats.bank_stats`'s
    ``flip_counts_by_kind``), under its own Beta (``prior``'s component of the same index as the kind in
    ``kinds``) and the shared lengths; a kind with no continuation takes ``fallback``. One kappa for all
    types let the kinds with most continuations set it: on the math bank the easy kind's 7,536 (flips
    0.067) pulled it to 1.20, at which the 31 % tier's simulated flips were 0.21 against the bank's 0.13
    and the 4 % tier's 0.09 against 0.01."""
    out = []
    for kind, component in zip(kinds, prior):
        by = {int(d): c for d, c in (counts.get(kind) or {}).items() if int(d) >= 1 and c[1]}
        if not by:
            out.append(float(fallback))
            continue
        depths = sorted(by)
        one = ((1.0, float(component[1]), float(component[2])),)
        fit = concentration_under_lengths(depths, [by[d][0] for d in depths], [by[d][1] for d in depths], one,
                                          lengths, kept)
        out.append(float(np.clip(fit, 1e-3, 1e6)))
    return tuple(out)


def sim_overrides(calibrated: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~trace_gym.bench.config.SimBenchConfig` keys of a :func:`calibration` result."""
    from trace_gym.sim.prior import TYPE_KEYS

    tuples = ("turn_shares", "success_turn_shares", *TYPE_KEYS)
    keys = ("mean_success", "target_mixed", "step_concentration", "min_turns", "max_turns", *tuples,
            "success_turn_tilt", "type_visibility", "feature_spearman", "predictor_level_shift", "warmup_prompts",
            "signal_noise", "prefix_sees_turn", "prompts_alike")
    out = {k: tuple(calibrated[k]) if k in tuples else calibrated[k] for k in keys if k in calibrated}
    if "recorded_shape" in calibrated:  # the prefixes the bank bench can continue from: the bank's cap
        out["prefixes_per_root"] = int(calibrated["recorded_shape"].get("prefixes_per_root") or 0)
    return out
