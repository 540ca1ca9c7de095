"""Simulated multi-turn tasks with a known success martingale, for allocation benchmarks.

No model, no environment: a task i has a true success probability p_i, and an episode
reveals its outcome turn by turn. The *value* V_t = P(success | history after t turns)
follows a beta-splitting martingale:

    V_0 = p_i
    V_{t+1} ~ Beta(kappa V_t, kappa (1 - V_t))     for t + 1 < T_i   (E[V_{t+1} | V_t] = V_t)
    V_T     ~ Bernoulli(V_{T-1})                   the reward, in {0, 1}

``kappa`` (``step_concentration``) sets how much one turn reveals:
Var(V_{t+1} | V_t) = V_t (1 - V_t) / (kappa + 1). A continuation from a saved prefix
at turn t restarts the martingale from that node's V_t, exactly as restoring an env
snapshot and resampling the policy would. So the simulator exercises the same trees,
planning functions and strategies as the real rollout loop.

Difficulty: p ~ Beta(a, b) with a chosen mean, and a concentration a + b solved so
that a GRPO group of G fresh rollouts is mixed with a target probability:

    P(mixed) = E[1 - p^G - (1 - p)^G],   E[p^G] = prod_{i<G} (a + i) / (a + b + i)

(closed form; ``calibrate_prior``). The default, 0.27 at G = 8, is GRPO's effective
ratio on DeepScaleR with Qwen3-8B in the paper (26.8 %).

Predictors over :class:`SimState` live in :mod:`trace_gym.sim.predictors` (oracle,
noisy oracle, learned logistic regression on what a model could observe), which
imports this module (never the other way round). One simulated step is the one step
driver (:func:`trace_gym.step.driver.run_step`) with a :class:`SimBranchRunner`; which predictor
target is closer to the true value is measured in :mod:`trace_gym.sim.targets`.

Token and step counts are simulated too, so the ledger's exact units are meaningful:
each turn generates ~Poisson(``policy_tokens_per_turn``) tokens and returns
~Poisson(``observation_tokens_per_turn``); prefill counts the prompt and observations
of a root rollout and, for a continuation, its whole replayed context (no prefix cache).

Episode lengths: by default a task has one length T_i, shared by all its episodes. With
``SimWorld.turn_shares`` each branch draws its own length given its outcome, as a bank's
roots do (:mod:`trace_gym.sim.lengths`); only the turns a branch ran are counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import numpy as np

from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import BranchResult
from trace_gym.sim.lengths import LengthModel, check_lengths, check_tilt, episode_paths
from trace_gym.sim.prior import TYPE_KEYS, check_types, draw, mixed_probability
from trace_gym.tree import ROOT, RolloutTree, prefix_depths

_EPS = 1e-12


def logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=float), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


# ---------------------------------------------------------------------- difficulty prior
def calibrate_prior(target_mixed: float = 0.27, mean_success: float = 0.5, group_size: int = 8) -> tuple[float, float]:
    """Beta(a, b) with mean ``mean_success`` and P(mixed group of G) = ``target_mixed``.

    P(mixed) rises monotonically with the concentration s = a + b (from 0 as s -> 0,
    all mass at {0, 1}, to 1 - mu^G - (1 - mu)^G as s -> inf), so s is found by
    bisection on log s.
    """
    if not 0 < mean_success < 1:
        raise ValueError(f"mean_success must lie in (0, 1), got {mean_success!r}")
    ceiling = 1 - mean_success**group_size - (1 - mean_success) ** group_size
    if not 0 < target_mixed < ceiling:
        raise ValueError(
            f"target_mixed must lie in (0, {ceiling:.4f}) for mean {mean_success} and G = {group_size}, "
            f"got {target_mixed!r}"
        )

    def gap(log_s: float) -> float:
        s = np.exp(log_s)
        return mixed_probability(mean_success * s, (1 - mean_success) * s, group_size) - target_mixed

    lo, hi = np.log(1e-6), np.log(1e6)  # gap(lo) < 0 < gap(hi)
    for _ in range(100):  # bisection on log s; the bracket shrinks to ~1e-29
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    s = float(np.exp(0.5 * (lo + hi)))
    return mean_success * s, (1 - mean_success) * s


# ---------------------------------------------------------------------- tasks and states
@dataclass(frozen=True)
class SimWorld:
    """Everything that defines the simulated task family (documented units).

    Attributes:
        target_mixed: P(a uniform group of ``group_size`` is mixed) the prior is
            calibrated to (0.27: GRPO on DeepScaleR in the paper).
        mean_success: mean of the difficulty prior, E[p].
        group_size: G used for the calibration.
        min_turns, max_turns: episode length T_i ~ Uniform{min_turns..max_turns}, one per
            task, unless ``turn_shares`` is set.
        turn_shares: per-episode lengths (:mod:`trace_gym.sim.lengths`): the share of each
            length min_turns..max_turns among failed episodes (among every episode when
            ``success_turn_shares`` is empty); each branch draws its own length given its
            outcome, on a value path of max_turns turns. Empty (the default): one length per task.
        success_turn_shares: with ``turn_shares``, the shares among successful episodes (at p =
            ``mean_success`` when ``success_turn_tilt`` is not 0).
        success_turn_tilt: gamma of :mod:`trace_gym.sim.lengths`: with ``turn_shares``, a task of success
            probability p has successful lengths P(L = l | y = 1) ∝ s_l exp(-gamma (l - min_turns)
            (logit p - logit mean_success)) (> 0: an easier task succeeds earlier); 0 (the default): one
            histogram for every task.
        step_concentration: kappa of the beta-splitting martingale (larger: each turn
            reveals less).
        feature_dim: task features a learned predictor sees; feature 0 is
            logit(p) + N(0, feature_noise^2), the others are pure noise.
        feature_noise: std of the noise on the informative feature (logit units; ``inf``:
            no feature informs, a predictor's Spearman 0).
        signal_noise: std of the per-turn observation signal logit(V_t) + noise.
        prefix_sees_turn: whether the learned predictor also sees a prefix's turn (one intercept per
            turn, as a model reading the prefix's text sees how many turns it took); False (the default):
            one intercept for every prefix, what it knows of depth only through the signal.
        prompts_alike: the learned predictor sees no task feature (every one 0, the type too): every prompt
            reads alike to it, as prompts of one text do to a bank's predictor (the draws are made as
            without it, so the pool is otherwise the same).
        type_shares, type_means, type_concentrations: a prior of task *types*
            (:mod:`trace_gym.sim.prior`): type k's share, and its Beta's mean and concentration
            a + b. Empty (the default): one Beta, from ``target_mixed`` and ``mean_success``.
        type_step_concentrations: with types, each type's own kappa (a type's turns may reveal more or
            less of its outcome than another's); empty (the default): every task takes ``step_concentration``.
        type_visibility: with types, the probability that the one-hot type a learned predictor
            sees (K features after the ``feature_dim`` ones) is the task's own; otherwise it is a
            type drawn uniformly (0: the type is noise to the predictor; 1: it always sees it).
        prompt_tokens: prompt length (tokens).
        policy_tokens_per_turn, observation_tokens_per_turn: Poisson means (tokens).
    """

    target_mixed: float = 0.27
    mean_success: float = 0.5
    group_size: int = 8
    min_turns: int = 3
    max_turns: int = 6
    turn_shares: tuple[float, ...] = ()
    success_turn_shares: tuple[float, ...] = ()
    success_turn_tilt: float = 0.0
    step_concentration: float = 3.0
    feature_dim: int = 4
    feature_noise: float = 6.0
    signal_noise: float = 4.0
    prefix_sees_turn: bool = False
    prompts_alike: bool = False
    prompt_tokens: int = 150
    policy_tokens_per_turn: float = 200.0
    observation_tokens_per_turn: float = 80.0
    type_shares: tuple[float, ...] = ()
    type_means: tuple[float, ...] = ()
    type_concentrations: tuple[float, ...] = ()
    type_visibility: float = 1.0
    type_step_concentrations: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns}, {self.max_turns}")
        for name in ("turn_shares", "success_turn_shares", *TYPE_KEYS):  # a list from a caller: hashable too
            object.__setattr__(self, name, tuple(getattr(self, name)))
        check_lengths(self.turn_shares, self.success_turn_shares, self.min_turns, self.max_turns)
        check_tilt(self.success_turn_tilt, self.mean_success)
        if self.success_turn_tilt and not len(self.turn_shares):
            raise ValueError(f"success_turn_tilt {self.success_turn_tilt!r} needs turn_shares (per-episode lengths)")
        if self.step_concentration <= 0:
            raise ValueError(f"step_concentration must be > 0, got {self.step_concentration!r}")
        if not 0 <= self.signal_noise < float("inf"):
            raise ValueError(f"signal_noise must be a finite number >= 0, got {self.signal_noise!r}")
        for name in ("prefix_sees_turn", "prompts_alike"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.feature_dim < 1:
            raise ValueError(f"feature_dim must be >= 1, got {self.feature_dim!r}")
        check_types(self.type_shares, self.type_means, self.type_concentrations, self.type_visibility,
                    self.type_step_concentrations)

    def kappa(self, task_type: int | None) -> float:
        """The step concentration of a task of type ``task_type`` (``None``: a world of one type):
        its type's own with ``type_step_concentrations``, else ``step_concentration``."""
        if task_type is None or not self.type_step_concentrations:
            return self.step_concentration
        return float(self.type_step_concentrations[int(task_type)])

    def prior(self) -> tuple[float, float]:
        """Calibrated Beta(a, b) difficulty prior."""
        return calibrate_prior(self.target_mixed, self.mean_success, self.group_size)

    def difficulty(self) -> tuple[tuple[float, float, float], ...]:
        """The prior as components (share, a, b) (:mod:`trace_gym.sim.prior`): the types, else the one
        Beta of :meth:`prior`."""
        if not self.type_shares:
            return ((1.0, *self.prior()),)
        return tuple((w, m * c, (1 - m) * c)
                     for w, m, c in zip(self.type_shares, self.type_means, self.type_concentrations))

    def length_model(self) -> LengthModel | None:
        """The per-episode length model of ``turn_shares``; ``None``: one length per task."""
        if not len(self.turn_shares):
            return None
        return LengthModel.of(self.min_turns, self.max_turns, self.turn_shares, self.success_turn_shares,
                              self.success_turn_tilt, self.mean_success)


@dataclass(frozen=True)
class TaskPool:
    """A set of simulated tasks, as arrays indexed by task id.

    Attributes:
        success: p_i, shape (n,).
        features: what a learned predictor sees, shape (n, feature_dim), with task types (n, feature_dim + K):
            the one-hot type seen last.
        turns: T_i, shape (n,): every episode's length; with per-episode lengths the value
            path's horizon (max_turns), which no episode outruns.
        types: each task's type (:mod:`trace_gym.sim.prior`), shape (n,); ``None``: one type.
    """

    success: np.ndarray
    features: np.ndarray
    turns: np.ndarray
    types: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.success)


def make_pool(world: SimWorld, n_tasks: int, rng: np.random.Generator) -> TaskPool:
    """Draw ``n_tasks`` tasks from the world's calibrated prior."""
    p, types = draw(world.difficulty(), n_tasks, rng)
    feats = rng.standard_normal((n_tasks, world.feature_dim))
    if np.isfinite(world.feature_noise):  # infinite noise: feature 0 is as uninformative as the others
        feats[:, 0] = logit(p) + world.feature_noise * feats[:, 0]
    if len(world.turn_shares):  # each episode draws its own length (trace_gym.sim.lengths)
        turns = np.full(n_tasks, world.max_turns)
    else:
        turns = rng.integers(world.min_turns, world.max_turns + 1, size=n_tasks)
    k = len(world.type_shares)
    if k:  # drawn last: pools that differ only in visibility share every other draw
        seen = np.where(rng.random(n_tasks) < world.type_visibility, types, rng.integers(0, k, size=n_tasks))
        feats = np.concatenate([feats, (seen[:, None] == np.arange(k)[None, :]).astype(float)], axis=1)
    if world.prompts_alike:
        feats = np.zeros_like(feats)
    return TaskPool(success=p, features=feats, turns=turns, types=types)


@dataclass(frozen=True, slots=True)
class SimState:
    """A node's snapshot in the simulator (what 'restore' resumes from).

    Attributes:
        task: task index in the pool.
        turn: completed turns t.
        value: true P(success | history after t turns) (hidden from the learned predictor):
            V_t, or with per-episode lengths W_t, which also reads that the episode ran past t.
        signal: noisy observation logit(value) + N(0, signal_noise^2); 0 at the root.
        context_tokens: tokens in the history so far (prompt + all segments).
        latent: with per-episode lengths, the value path's V_t the future is drawn from;
            ``None``: ``value``.
    """

    task: int
    turn: int
    value: float
    signal: float = 0.0
    context_tokens: int = 0
    latent: float | None = None

    @property
    def latent_value(self) -> float:
        """V_t: ``latent``, or ``value`` where the two coincide."""
        return self.value if self.latent is None else self.latent


def root_state(pool: TaskPool, task: int, world: SimWorld) -> SimState:
    return SimState(task=int(task), turn=0, value=float(pool.success[task]), context_tokens=world.prompt_tokens)


def simulate_branches(
    tree: RolloutTree,
    anchors: Sequence[int],
    pool: TaskPool,
    world: SimWorld,
    rng: np.random.Generator,
    ledger: BudgetLedger,
) -> list[int]:
    """Run one rollout from each node in ``anchors`` (repeats allowed) to the end.

    From the root a rollout is a full rollout; from a deeper node a continuation
    (restore the node's state, resample the future). All branches are simulated in
    lockstep (vectorised over branches, turn by turn) and then appended to the tree one
    branch at a time, in ``anchors`` order. A branch ends at its task's T_i, or with
    ``world.turn_shares`` at its own length (:mod:`trace_gym.sim.lengths`). Records the
    exact units of the turns run (generated and prefill tokens, env steps) in ``ledger``;
    the nominal ones (rollouts, continuations) are the step driver's. Returns the leaf id
    of each branch.
    """
    if len(anchors) == 0:
        return []
    states: list[SimState] = [tree.node(a).snapshot for a in anchors]
    task = states[0].task
    if any(st.task != task for st in states):
        raise ValueError(f"anchors {list(anchors)} belong to different tasks; one tree is one task")
    T = int(pool.turns[task])
    start = np.array([st.turn for st in states])
    if (start >= T).any():
        raise ValueError(f"anchor at turn {int(start.max())} >= the task's last turn {T}; nothing to continue")
    model, kappa = world.length_model(), world.kappa(None if pool.types is None else pool.types[task])
    if model is None:
        values, latents = _task_paths(states, start, T, kappa, rng), None
        ends = np.full(len(start), T)
    else:
        latents, values, ends = episode_paths(np.array([st.latent_value for st in states]),
                                              np.array([st.value for st in states]), start, kappa,
                                              model.at(float(pool.success[task])), rng)
    return _record(tree, anchors, states, start, (values, latents, ends), world, rng, ledger)


def _task_paths(states: Sequence[SimState], start: np.ndarray, T: int, kappa: float,
                rng: np.random.Generator) -> np.ndarray:
    """The values of turns t0 + 1 .. T (t0 = min(start)) of branches that all end at T: shape
    (T - t0, n), the reward at row T."""
    count, t0 = len(states), int(start.min())
    n_rows = T - t0  # rows are turns t0 + 1 .. T
    values = np.empty((n_rows, count))
    v = np.array([st.value for st in states], dtype=float)
    for row in range(n_rows):
        t = t0 + 1 + row
        if t < T:
            step = (start < t) & (kappa * v > 0.0) & (kappa * (1 - v) > 0.0)  # an underflowing a or b: settled
            if step.any():
                v = v.copy()
                v[step] = rng.beta(kappa * v[step], kappa * (1 - v[step]))
        else:
            v = (rng.random(count) < v).astype(float)
        values[row] = v
    return values


def _record(tree: RolloutTree, anchors: Sequence[int], states: Sequence[SimState], start: np.ndarray,
            paths: tuple[np.ndarray, np.ndarray | None, np.ndarray], world: SimWorld, rng: np.random.Generator,
            ledger: BudgetLedger) -> list[int]:
    """Tokens, signals and ledger units of the branches' turns (``paths``: values and latent values
    of shape (rows, n), rows the turns t0 + 1 .., and each branch's end turn), then the turns
    appended to ``tree``; returns the leaves. Only a branch's turns start + 1 .. end are counted."""
    values, latents, ends = paths
    n_rows, count = values.shape
    t0, task = int(start.min()), states[0].task
    turn = (t0 + 1 + np.arange(n_rows))[:, None]
    active = (turn > start[None, :]) & (turn <= ends[None, :])  # (n_rows, count)
    last = ends - t0 - 1  # each branch's terminal row
    cols = np.arange(count)
    gen = rng.poisson(world.policy_tokens_per_turn, size=(n_rows, count)) * active
    obs = rng.poisson(world.observation_tokens_per_turn, size=(n_rows, count)) * active
    obs[last, cols] = 0  # no observation after the final answer
    signal = logit(values) + world.signal_noise * rng.standard_normal((n_rows, count))
    signal[last, cols] = 0.0
    ctx = np.array([st.context_tokens for st in states]) + np.cumsum(gen + obs, axis=0)

    is_root = np.array([a == ROOT for a in anchors])
    n_roots = int(is_root.sum())
    ledger.add_tokens(
        generated=int(gen.sum()),
        prefill=int(obs.sum()) + n_roots * world.prompt_tokens
        + sum(st.context_tokens for st, r in zip(states, is_root) if not r),
    )
    ledger.add_env_steps(int(active.sum()))

    latent_rows = [None] * count if latents is None else latents.T.tolist()
    leaves = []
    for j, (vals, sigs, ctxs, gens, obss) in enumerate(
        zip(values.T.tolist(), signal.T.tolist(), ctx.T.tolist(), gen.T.tolist(), obs.T.tolist())
    ):
        anchor = anchors[j]
        branch = tree.start_branch(anchor)
        node = anchor
        for row in range(int(start[j]) - t0, int(last[j]) + 1):
            end = row == last[j]
            node = tree.add_turn(
                node,
                branch=branch,
                snapshot=SimState(task, t0 + 1 + row, vals[row], sigs[row], ctxs[row],
                                  None if latent_rows[j] is None else latent_rows[j][row]),
                reward=vals[row] if end else None,
                terminal=end,
                info={"policy_tokens": gens[row], "observation_tokens": obss[row]},
            )
        leaves.append(node)
    return leaves


# ---------------------------------------------------------------------- the branch runner
class CappedTree(RolloutTree):
    """A tree whose root rollouts offer as prefixes only the depths a bank recording with
    ``max_prefixes_per_root = prefix_cap`` keeps (:func:`trace_gym.tree.prefix_depths`): the prefixes
    the bank bench can continue from, so a simulator standing in for a bank offers its strategies the
    same choice (the bank bench leaves the others out: :class:`trace_gym.banks.replay.BankTree`)."""

    def __init__(self, *args: Any, prefix_cap: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix_cap = prefix_cap

    def expansion_candidates(self) -> list[tuple[int, float]]:
        out = []
        for node_id, reward in super().expansion_candidates():
            node = self.nodes[node_id]
            turns = self.nodes[self.branch_leaf(node.branch)].depth
            if node.depth in prefix_depths(turns, self.prefix_cap):
                out.append((node_id, reward))
        return out


@dataclass
class SimBranchRunner:
    """The simulator as a :class:`~trace_gym.step.driver.BranchRunner`.

    Candidates are task indices into ``pool``; the predictor reads :class:`SimState`
    snapshots. Requested branches wait until :meth:`advance`, which simulates all of
    them (per tree, in request order, vectorised) in the ``simulation`` phase. With
    ``prefix_cap`` (an integer >= 1) each tree is a :class:`CappedTree`; ``None``: every prefix.
    With ``draws`` (a :class:`~trace_gym.sim.draws.CommonDraws`) each branch runs on its own stream,
    keyed by its task and its place in the task's history instead of ``rng``: arms that share ``draws``'
    seed draw the same outcome for the same request, as a bank bench's arms do (one branch at a time).
    """

    pool: TaskPool
    world: SimWorld
    rng: np.random.Generator
    prefix_cap: int | None = None
    draws: Any = None
    _trees: dict[Hashable, RolloutTree] = field(default_factory=dict, init=False, repr=False)
    _pending: dict[Hashable, list[int]] = field(default_factory=dict, init=False, repr=False)
    _keys: dict[tuple[Hashable, int], tuple] = field(default_factory=dict, init=False, repr=False)

    def prompt_context(self, candidate: Any) -> SimState:
        return root_state(self.pool, int(candidate), self.world)

    def node_context(self, key: Hashable, node_id: int) -> SimState:
        return self._trees[key].nodes[node_id].snapshot

    def new_tree(self, key: Hashable, candidate: Any) -> RolloutTree:
        context, task_id = self.prompt_context(candidate), f"sim/{int(candidate)}"
        tree = (RolloutTree(task_id=task_id, snapshot=context) if not self.prefix_cap else
                CappedTree(task_id=task_id, snapshot=context, prefix_cap=self.prefix_cap))
        self._trees[key] = tree
        return tree

    def start_roots(self, key: Hashable, count: int, ledger: BudgetLedger) -> None:
        self._pending.setdefault(key, []).extend([ROOT] * count)

    def start_continuations(self, key: Hashable, node_id: int, count: int, ledger: BudgetLedger) -> None:
        self._pending.setdefault(key, []).extend([node_id] * count)

    @property
    def live(self) -> int:
        return sum(len(anchors) for anchors in self._pending.values())

    def advance(self, ledger: BudgetLedger) -> list[BranchResult]:
        pending, self._pending = self._pending, {}
        out: list[BranchResult] = []
        with ledger.phase("simulation"):
            for key, anchors in pending.items():
                tree = self._trees[key]
                if self.draws is None:
                    leaves = simulate_branches(tree, anchors, self.pool, self.world, self.rng, ledger)
                else:
                    leaves = [self._common(key, tree, anchor, ledger) for anchor in anchors]
                out.extend(BranchResult(key, anchor, leaf) for anchor, leaf in zip(anchors, leaves))
        return out

    def _common(self, key: Hashable, tree: RolloutTree, anchor: int, ledger: BudgetLedger) -> int:
        """One branch from ``anchor`` on its common stream (:attr:`draws`); returns its leaf."""
        task = int(tree.root.snapshot.task)
        if anchor == ROOT:
            branch, rng = self.draws.root(task)
        else:
            node = tree.node(anchor)
            branch, rng = self.draws.continuation(task, self._keys[(key, node.branch)], node.depth)
        leaf = simulate_branches(tree, [anchor], self.pool, self.world, rng, ledger)[0]
        self._keys[(key, tree.node(leaf).branch)] = branch
        return leaf

    def cancel(self) -> None:
        self._pending.clear()
