"""The simulator's difficulty prior: one Beta, or a mixture of task *types*, each a Beta (pure functions).

A prior is a tuple of components ``(share, a, b)``: a task draws its type k with probability
``share_k``, then its success probability p ~ Beta(a_k, b_k). One component is the simulator's
classic prior (:func:`trace_gym.sim.simulator.calibrate_prior`). Several model a task family made
of kinds of task a policy either mostly solves or mostly fails (templates, topics, tools), which a
learned predictor can tell apart from the prompt alone, as an embedding tells a template:
:func:`trace_gym.sim.simulator.make_pool` shows each task's type to the predictor (a one-hot
feature, right with probability ``type_visibility``). The generated math family is such a family:
its four tiers (``gen/d0``, ``gen/d1``, ``gen/d2``, ``sum``) are solved by SmolLM2 about 31 %, 4 %,
0 % and 87 % of the time, and the bank's embedding predictor reads the tier and little else (on the
math bank: Spearman 0.845, AUC 0.747, Brier 0.108; a simulated predictor that sees the type and
nothing else: 0.842, 0.743, 0.104). One Beta matched to the shape bank's counts could not give a
simulated predictor both the bank predictor's picks and its calibration, and TRACE, which reads
the calibration, fell to 0.474 against the bank's 0.633 (docs/benchmarking.md).

- :func:`components_of`: a prior from a Beta pair or components (checked, shares summing to 1).
- :func:`draw`: tasks' p and types (one component draws exactly what ``rng.beta(a, b, n)`` does).
- :func:`quantiles`: a deterministic sample of p (common random numbers for fits).
- :func:`mean_variance_term`: E[p (1 - p)], what flip rates scale with.
- :func:`mixed_share`: P(a group of G fresh rollouts is mixed).
- :func:`types_from_kinds`: a bank's types, one per task kind its ids name
  (:func:`trace_gym.banks.stats.task_kind`), each kind's Beta the maximum likelihood of its
  prompts' counts (:func:`beta_mle`). The kinds, not a mixture fitted to the counts alone: on the
  math bank of 16 roots the counts' best mixture (by the Bayesian information criterion) has two
  types and lumps the tier its policy mostly fails with the one it half solves, which its
  predictor tells apart (the tier is in the prompt's form).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: One component: (share, a, b).
Component = tuple[float, float, float]
Prior = tuple[Component, ...]

#: Bounds of each fitted component's Beta parameters (a, b), as the single fit's concentration.
PARAMETER_BOUNDS = (1e-3, 1e5)


def components_of(prior: Sequence[float] | Sequence[Sequence[float]]) -> Prior:
    """A prior as components: ``(a, b)`` is one Beta; ``((share, a, b), ...)`` a mixture.

    Raises:
        ValueError: a share not in (0, 1], shares not summing to 1 (within 1e-6), a Beta
            parameter not finite and > 0 (one line naming the value).
    """
    items = list(prior)
    if items and not isinstance(items[0], (tuple, list, np.ndarray)):
        if len(items) != 2:
            raise ValueError(f"a Beta prior is a pair (a, b), got {tuple(items)!r}")
        items = [(1.0, items[0], items[1])]
    out = tuple((float(w), float(a), float(b)) for w, a, b in items)
    if not out:
        raise ValueError("a prior needs at least one component")
    for w, a, b in out:
        if not 0 < w <= 1:
            raise ValueError(f"a type's share must lie in (0, 1], got {w!r}")
        if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
            raise ValueError(f"a type's Beta parameters must be finite and > 0, got a={a!r}, b={b!r}")
    total = sum(w for w, _, _ in out)
    if abs(total - 1) > 1e-6:
        raise ValueError(f"the types' shares must sum to 1, got {total!r}")
    return out


def draw(prior: Prior, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` tasks' success probabilities and types (shapes (n,)). One component draws exactly
    ``rng.beta(a, b, size=n)`` (type 0), so a one-Beta world's pools are what they always were."""
    if len(prior) == 1:
        _, a, b = prior[0]
        return rng.beta(a, b, size=n), np.zeros(n, dtype=np.int64)
    shares = np.array([w for w, _, _ in prior])
    types = rng.choice(len(prior), size=n, p=shares / shares.sum())
    a = np.array([c[1] for c in prior])[types]
    b = np.array([c[2] for c in prior])[types]
    return rng.beta(a, b), types


def quantiles(prior: Prior, samples: int) -> np.ndarray:
    """A deterministic sample of p of about ``samples`` values: each component's mid-point quantiles,
    as many as its share of ``samples`` (at least one). Shape (m,), sorted within each component."""
    from scipy import stats

    out = []
    for w, a, b in prior:
        m = max(1, int(round(w * samples)))
        out.append(stats.beta.ppf((np.arange(m) + 0.5) / m, a, b))
    return np.concatenate(out)


def mean_variance_term(prior: Prior) -> float:
    """E[p (1 - p)] = sum_k share_k mu_k (1 - mu_k) s_k / (s_k + 1), s_k = a_k + b_k."""
    return float(sum(w * a * b / (a + b) ** 2 * (a + b) / (a + b + 1) for w, a, b in prior))


def mixed_share(prior: Prior, group_size: int) -> float:
    """P(a group of ``group_size`` fresh rollouts is mixed): the components' shares of
    :func:`mixed_probability`."""
    return float(sum(w * mixed_probability(a, b, group_size) for w, a, b in prior))


def mixed_probability(a: float, b: float, group_size: int = 8) -> float:
    """E[1 - p^G - (1 - p)^G] for p ~ Beta(a, b): P(a group of G fresh rollouts is mixed)."""
    if a <= 0 or b <= 0:
        raise ValueError(f"Beta parameters must be > 0, got a={a!r}, b={b!r}")
    if group_size < 1 or int(group_size) != group_size:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    i = np.arange(int(group_size))
    e_success = np.prod((a + i) / (a + b + i))
    e_failure = np.prod((b + i) / (a + b + i))
    return float(1.0 - e_success - e_failure)


def log_likelihood(prior: Prior, successes: np.ndarray, totals: np.ndarray) -> float:
    """The beta-binomial log likelihood of per-prompt counts (the binomial coefficients included)."""
    from scipy import special

    s, n = np.asarray(successes, dtype=float), np.asarray(totals, dtype=float)
    choose = special.gammaln(n + 1) - special.gammaln(s + 1) - special.gammaln(n - s + 1)
    terms = [math.log(w) + special.betaln(s + a, n - s + b) - special.betaln(a, b) for w, a, b in prior]
    return float((choose + np.logaddexp.reduce(np.stack(terms), axis=0)).sum())


def beta_mle(successes: Sequence[int], totals: Sequence[int]) -> tuple[float, float]:
    """The maximum-likelihood Beta(a, b) of per-prompt counts (beta-binomial; Nelder-Mead on log a,
    log b within :data:`PARAMETER_BOUNDS`, from the method of moments' mean at two concentrations).
    Counts that never (always) succeed run a (b) to its lower bound: a type whose mean is ~0 (~1).

    Raises:
        ValueError: no prompts, or counts outside 0 <= s_i <= n_i with n_i >= 1.
    """
    from scipy import optimize

    s, n = np.asarray(successes, dtype=float), np.asarray(totals, dtype=float)
    if s.shape != n.shape or s.size < 1:
        raise ValueError(f"need counts of at least one prompt (same length), got {s.size} and {n.size}")
    if (s < 0).any() or (s > n).any() or (n < 1).any():
        raise ValueError("every prompt needs >= 1 recorded root and 0 <= successes <= roots")
    lo, hi = (math.log(x) for x in PARAMETER_BOUNDS)

    def nll(x: np.ndarray) -> float:
        a, b = np.exp(np.clip(x, lo, hi))
        return -log_likelihood(((1.0, float(a), float(b)),), s, n)

    mu = float(np.clip(s.sum() / n.sum(), 1e-3, 1 - 1e-3))
    fits = [optimize.minimize(nll, np.log([mu * c, (1 - mu) * c]), method="Nelder-Mead",
                              options={"maxiter": 4000, "xatol": 1e-7, "fatol": 1e-9}) for c in (1.0, 20.0)]
    a, b = np.exp(np.clip(min(fits, key=lambda f: f.fun).x, lo, hi))
    return float(a), float(b)


#: Prompts a kind needs for its own type (:func:`types_from_kinds`).
MIN_KIND_PROMPTS = 3


#: How much lower the kinds' Bayesian information criterion must be than one Beta's for :func:`types_from_kinds`
#: to keep them: 10, "very strong" evidence on Kass and Raftery's scale (1995).
BIC_MARGIN = 10.0


def types_from_kinds(kinds: Sequence[str], successes: Sequence[int], totals: Sequence[int],
                     min_prompts: int = MIN_KIND_PROMPTS,
                     margin: float = BIC_MARGIN) -> tuple[Prior, tuple[str, ...], dict] | None:
    """Task types from a bank's task kinds (:func:`trace_gym.banks.stats.task_kind`, one per prompt): each
    kind a type, its share the kind's share of the prompts, its Beta the :func:`beta_mle` of its prompts'
    counts; with the kinds' names, in the types' order (sorted by name), and ``{"bic_one", "bic_kinds"}``.
    ``None`` where there are fewer than two kinds, a kind has fewer than ``min_prompts`` prompts (too few
    to fit its Beta), or the kinds do not explain the counts: their Bayesian information criterion (2
    parameters per kind) is not ``margin`` below one Beta's (2 parameters). The math banks' four tiers
    clear it by 120 to 460; the QA bank's three relations (0.6) do not, and there types moved the
    calibrated simulator's TRACE far from the bank (0.448 against 0.338)."""
    k = np.asarray(list(kinds), dtype=object)
    s, n = np.asarray(successes, dtype=float), np.asarray(totals, dtype=float)
    if not (k.shape == s.shape == n.shape):
        raise ValueError(f"need one kind per prompt's counts, got {k.size} kinds for {s.size} prompts")
    names = tuple(sorted(set(k.tolist())))
    if len(names) < 2 or min(int((k == x).sum()) for x in names) < min_prompts:
        return None
    fits = [beta_mle(s[k == x], n[k == x]) for x in names]
    fitted = sum(log_likelihood(((1.0, a, b),), s[k == x], n[k == x]) for (a, b), x in zip(fits, names))
    one = log_likelihood(((1.0, *beta_mle(s, n)),), s, n)
    bic = {"bic_one": 2 * math.log(s.size) - 2 * one, "bic_kinds": 2 * len(names) * math.log(s.size) - 2 * fitted}
    if bic["bic_one"] - bic["bic_kinds"] <= margin:
        return None
    return tuple((float((k == x).mean()), a, b) for (a, b), x in zip(fits, names)), names, bic


#: The :class:`~trace_gym.sim.simulator.SimWorld` (and simulated bench) keys of a prior of task types: one
#: value per type each (``type_step_concentrations`` may be empty: every type takes ``step_concentration``).
TYPE_KEYS = ("type_shares", "type_means", "type_concentrations", "type_step_concentrations")


def check_type_kappas(kappas: Sequence[float], types: int) -> None:
    """Per-type step concentrations (one line naming a bad value): empty (every type takes
    ``step_concentration``), or one finite value > 0 per type of ``type_shares``."""
    if not len(kappas):
        return
    if len(kappas) != types:
        raise ValueError(f"type_step_concentrations needs one value per type ({types}), got {len(kappas)}")
    for k in kappas:
        if not (k > 0 and np.isfinite(k)):
            raise ValueError(f"type_step_concentrations must be finite and > 0, got {k!r}")


def check_types(shares: Sequence[float], means: Sequence[float], concentrations: Sequence[float],
                visibility: float, kappas: Sequence[float] = ()) -> None:
    """A prior of task types (one line naming a bad value): three lists of one length (empty: no
    types), shares in (0, 1] summing to 1, means in (0, 1), concentrations > 0, a visibility in
    [0, 1], and per-type kappas (:func:`check_type_kappas`)."""
    if not 0 <= visibility <= 1:
        raise ValueError(f"type_visibility must lie in [0, 1], got {visibility!r}")
    if not (len(shares) == len(means) == len(concentrations)):
        raise ValueError(f"type_shares, type_means and type_concentrations need one value per type, got "
                         f"{len(shares)}, {len(means)} and {len(concentrations)}")
    check_type_kappas(kappas, len(shares))
    if not len(shares):
        return
    for m in means:
        if not 0 < m < 1:
            raise ValueError(f"type_means must lie in (0, 1), got {m!r}")
    for c in concentrations:
        if not (c > 0 and np.isfinite(c)):
            raise ValueError(f"type_concentrations must be finite and > 0, got {c!r}")
    if abs(sum(shares) - 1) > 1e-6 or min(shares) <= 0:
        raise ValueError(f"type_shares must be shares > 0 summing to 1, got {tuple(shares)!r} (sum {sum(shares):g})")
    components_of([(w, m * c, (1 - m) * c) for w, m, c in zip(shares, means, concentrations)])
