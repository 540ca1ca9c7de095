"""Advantage estimators: the finished rollout tree of one prompt -> what each policy token is trained with.

Every estimator is a pure function ``estimator(tree, *, eps, std_normalize)`` over a
finished :class:`~trace_gym.tree.RolloutTree` (one tree holds every rollout of one prompt:
its root rollouts and their continuations). It returns one of two objectives:

- :class:`PathAdvantages` (``grpo``, ``tree_grpo``): an advantage ``A_l`` per leaf. The
  objective is exactly that of training each leaf's path (prompt to leaf) as its own
  sequence with ``A_l``: per policy token, ``sum over the leaves l below it of
  min(r A_l, clip(r) A_l)``. A prefix shared by several leaves is computed once and
  carries two numbers, the sums ``A+`` and ``A-`` of its leaves' positive and negative
  advantages (:mod:`trace_gym.train.batches`), because ``min(r A, clip(r) A)`` is
  ``A min(r, clip(r))`` for ``A > 0`` and ``A max(r, clip(r))`` for ``A < 0``. Summing the
  advantages first would let opposite-sign leaves cancel before PPO's ``min`` once the
  ratio ``r`` leaves 1 (several epochs or mini-batches, an off-policy engine);
- a node mapping ``{node id: A}`` (``treerpo``, and any estimator returning a plain
  mapping): every policy token of node ``v`` carries ``A[v]``, once, as part of the
  rollout (branch) that generated it.

Observation tokens (the env's answer, the chat template's glue, the prompt) carry nothing,
and the root (the prompt) never appears. :func:`node_advantages` gives the per-node total
of either form (the weight of a token at ratio 1).

Groups and normalisation, shared by all estimators:

- a *group* is a set of values ``x_1..x_n`` (leaf rewards or node values); its members
  get ``(x_i - mean) / (std + eps)`` with the sample standard deviation (``ddof = 1``,
  as ``torch.std`` in verl's and TRL's GRPO), or ``x_i - mean`` when
  ``std_normalize=False`` (Dr. GRPO);
- a group of one has nothing to contrast with and contributes exactly 0 (verl's GRPO
  instead takes mean 0 and std 1, so a lone member carries its raw reward; under
  Tree-GRPO every root rollout without a continuation would then add ``+R`` on top of its
  prompt-level term). So on a one-level tree (root rollouts only) ``grpo``, ``treerpo``
  and ``tree_grpo`` are the same objective;
- a group whose members are all equal contributes exactly 0.

Rewards need not be 0/1: BFCL's partial credit or an F1 score go through unchanged.

Estimators (``ESTIMATORS`` names them; a new one is one entry, from a user's package with
:func:`register_estimator` or the ``trace_gym.train.advantages`` entry-point group):

``grpo``
    Flat GRPO: the group is every leaf of the prompt, ``A_i = (R_i - mean) / (std + eps)``,
    each leaf's path trained as its own sequence (:class:`PathAdvantages`).

``treerpo``
    TreeRPO on recursive node values ``V`` (``tree.targets()``: a leaf's reward, an inner
    node's mean over its children). The tree is cut into *segments*: a segment starts at a
    child ``c`` of the root or of a branching node (a node with two or more children) and
    runs down through single-child nodes to the next branching node or leaf (which it
    includes). Each sibling group (the children of the root or of one branching node) gets
    ``A_c = (V_c - mean_sib) / (std_sib + eps)``, and every node of ``c``'s segment carries
    ``A_c``. So each edge is trained once, with the contrast of the branch point it hangs
    from; a sibling group without variance (or of one) contributes zero. On a tree without
    continuations every segment is one whole rollout and the root's children are the GRPO
    group: ``treerpo == grpo`` (tested). Where this differs from the TreeRPO paper:
    ``docs/training.md``.

``tree_grpo``
    Tree-GRPO: ``A_i = (R_i - mu_prompt) / (sd_prompt + eps) + (R_i - mu_tree) / (sd_tree + eps)``
    per leaf ``i``, where the prompt group is every leaf of the prompt and the tree group is
    every leaf of ``i``'s own tree. A *tree* in Tree-GRPO's sense is one root rollout grown
    by its continuations: the subtree below one child of the root (continuations always
    start from a root rollout's prefix). A tree with a single leaf is a group of one and
    adds 0. Each leaf's path is trained as its own sequence (:class:`PathAdvantages`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, Union

from trace_gym.tree import ROOT, RolloutTree

#: Default epsilon added to a group's standard deviation.
DEFAULT_EPS = 1e-6


@dataclass(frozen=True)
class PathAdvantages:
    """Per leaf ``l`` of a tree, the advantage ``A_l`` that every policy token on ``l``'s
    path carries, each leaf's path being one sequence of the objective (see the module
    docstring).

    Attributes:
        leaves: leaf node id -> ``A_l``; every leaf of the tree appears (a zero still makes
            its path a sequence of the loss normalisers).
    """

    leaves: Mapping[int, float]


#: What an estimator returns: per-leaf path advantages, or ``{node id: A}``.
Advantages = Union[PathAdvantages, Mapping[int, float]]


class AdvantageEstimator(Protocol):
    """``(tree, *, eps, std_normalize) -> PathAdvantages | {node id: A}``."""

    def __call__(self, tree: RolloutTree, *, eps: float = DEFAULT_EPS,
                 std_normalize: bool = True) -> Advantages: ...


def group_normalize(values: Sequence[float], *, eps: float = DEFAULT_EPS, std_normalize: bool = True) -> list[float]:
    """``(x_i - mean) / (std + eps)`` over one group (sample std, ``ddof = 1``).

    A group of one gives ``[0.0]`` (nothing to contrast with; see the module docstring);
    ``std_normalize=False`` returns ``x_i - mean`` (Dr. GRPO).

    >>> group_normalize([1.0, 0.0], eps=0.0)
    [0.7071067811865475, -0.7071067811865475]
    """
    xs = [float(x) for x in values]
    if not xs:
        return []
    bad = [x for x in xs if not math.isfinite(x)]
    if bad:
        raise ValueError(f"group values must be finite, got {bad[:3]}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if all(x == xs[0] for x in xs):
        return [0.0] * len(xs)  # a group of one, or no variance: exactly zero, not rounding noise
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    if not std_normalize:
        return [x - mean for x in xs]
    if std + eps == 0:
        raise ValueError("std + eps is 0; use eps > 0")
    return [(x - mean) / (std + eps) for x in xs]


def _check_finished(tree: RolloutTree) -> list[int]:
    leaves = [n.id for n in tree.leaves()]
    if not leaves:
        raise ValueError(f"tree {tree.task_id!r} has no finished leaf; advantages need finished rollouts")
    dangling = [n.id for n in tree.nodes[1:] if not n.terminal and not n.children]
    if dangling:
        raise ValueError(f"tree {tree.task_id!r} has unfinished branches ending at nodes {dangling[:5]}")
    for i in leaves:
        r = tree.nodes[i].reward
        if r is None or not math.isfinite(r):
            raise ValueError(f"leaf {i} of tree {tree.task_id!r} has reward {r!r}; expected a finite float")
    return leaves


def leaf_sums(tree: RolloutTree, leaf_advantages: Mapping[int, float]) -> dict[int, float]:
    """Per non-root node: the sum of ``leaf_advantages`` over the leaves below it (itself
    included), i.e. the weight a token gets when every leaf's path is trained with its own
    ``A_i``."""
    total = [0.0] * len(tree.nodes)
    for n in reversed(tree.nodes):  # children always have larger ids
        if n.terminal:
            total[n.id] += float(leaf_advantages[n.id])
        if n.parent is not None:
            total[n.parent] += total[n.id]
    return {n.id: total[n.id] for n in tree.nodes if n.id != ROOT}


def node_advantages(tree: RolloutTree, advantages: Advantages) -> dict[int, float]:
    """Per non-root node, the total advantage its policy tokens carry at ratio 1: the sum
    over the leaves below it for :class:`PathAdvantages`, the mapping itself otherwise."""
    if isinstance(advantages, PathAdvantages):
        return leaf_sums(tree, advantages.leaves)
    return {int(k): float(v) for k, v in advantages.items()}


def grpo(tree: RolloutTree, *, eps: float = DEFAULT_EPS, std_normalize: bool = True) -> PathAdvantages:
    """Flat GRPO over every leaf of the prompt, each leaf's path its own sequence."""
    leaves = _check_finished(tree)
    rewards = [tree.nodes[i].reward for i in leaves]
    return PathAdvantages(dict(zip(leaves, group_normalize(rewards, eps=eps, std_normalize=std_normalize))))


def segment_heads(tree: RolloutTree) -> dict[int, int]:
    """Node id -> the head of its segment (see ``treerpo``): the highest node on its path
    that is a child of the root or of a branching node, with only single-child nodes
    between them."""
    head: dict[int, int] = {}
    for n in tree.nodes[1:]:  # parents come before children
        parent = tree.nodes[n.parent]  # type: ignore[index]
        starts = parent.id == ROOT or len(parent.children) >= 2
        head[n.id] = n.id if starts else head[parent.id]
    return head


def treerpo(tree: RolloutTree, *, eps: float = DEFAULT_EPS, std_normalize: bool = True) -> dict[int, float]:
    """TreeRPO: sibling-relative advantages of recursive node values, one per segment."""
    _check_finished(tree)
    values = tree.targets()
    at_head: dict[int, float] = {}
    for n in tree.nodes:
        if n.terminal or not (n.id == ROOT or len(n.children) >= 2):
            continue
        kids = [c for c in n.children if c in values]
        for c, a in zip(kids, group_normalize([values[c] for c in kids], eps=eps, std_normalize=std_normalize)):
            at_head[c] = a
    return {node: at_head.get(h, 0.0) for node, h in segment_heads(tree).items()}


def tree_grpo(tree: RolloutTree, *, eps: float = DEFAULT_EPS, std_normalize: bool = True) -> PathAdvantages:
    """Tree-GRPO: prompt-level plus tree-level group advantages per leaf, each leaf's path
    its own sequence."""
    leaves = _check_finished(tree)
    rewards = {i: float(tree.nodes[i].reward) for i in leaves}  # type: ignore[arg-type]
    prompt_term = dict(zip(leaves, group_normalize([rewards[i] for i in leaves], eps=eps,
                                                   std_normalize=std_normalize)))
    by_tree: dict[int, list[int]] = {}
    for i in leaves:
        by_tree.setdefault(tree.path(i)[1], []).append(i)
    total = dict(prompt_term)
    for members in by_tree.values():
        for i, a in zip(members, group_normalize([rewards[i] for i in members], eps=eps, std_normalize=std_normalize)):
            total[i] += a
    return PathAdvantages(total)


#: Every advantage estimator by name. A new estimator is one entry (:func:`register_estimator`).
ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": grpo,
    "treerpo": treerpo,
    "tree_grpo": tree_grpo,
}
#: The entry-point group through which installed packages add estimators.
ENTRY_POINT_GROUP = "trace_gym.train.advantages"
_BUILTIN = frozenset(ESTIMATORS)


def register_estimator(name: str, estimator: AdvantageEstimator) -> str:
    """Add ``estimator`` to :data:`ESTIMATORS` as ``name``; ``advantage=<name>`` then picks it
    in every config. Re-registering the same function is a no-op; another function under a
    taken name, or a built-in name, is refused. Returns ``name``.

    Raises:
        ValueError: a bad or taken name, or an estimator that is not callable with
            ``(tree, *, eps, std_normalize)``.
    """
    import inspect

    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"estimator name must be an identifier such as 'my_grpo', got {name!r}")
    if not callable(estimator):
        raise ValueError(f"estimator {name!r} must be callable as fn(tree, *, eps, std_normalize), got {estimator!r}")
    try:
        inspect.signature(estimator).bind(None, eps=DEFAULT_EPS, std_normalize=True)
    except TypeError as exc:
        raise ValueError(f"estimator {name!r} must accept (tree, *, eps, std_normalize): {exc}") from None
    if ESTIMATORS.get(name, estimator) is not estimator:
        why = "a built-in estimator" if name in _BUILTIN else "already registered to another function"
        raise ValueError(f"estimator name {name!r} is {why}; choose another name")
    ESTIMATORS[name] = estimator
    return name


def get_estimator(name: str) -> AdvantageEstimator:
    """Look an estimator up by name, with the known names in the error."""
    if name not in ESTIMATORS:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ESTIMATORS)}"
                         f"{did_you_mean(name, ESTIMATORS)}")
    return ESTIMATORS[name]
