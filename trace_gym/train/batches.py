"""Token batches over rollout trees: each tree edge once, packed into micro-batches by token count.

The trainer never flattens a tree into one sequence per leaf (which would train a shared
prefix once per leaf and encode it as many times). Instead a micro-batch is one *packed
row* holding whole trees, or parts of trees, in which every node's tokens appear once:

- a :class:`TokenTree` is one prompt's tree as token segments: per node its policy tokens
  (loss mask 1) then its observation tokens (loss mask 0; for the root, the prompt), the
  objective's sequences that hold the node with their advantages (:class:`TokenNode`),
  and the engine's sampling logprobs; :func:`node_coefficients` folds the aggregation
  mode into two numbers per token (``A+``, ``A-``) and a weight;
- :func:`plan_rows` chooses, per micro-batch, which nodes to *train* and which to carry
  as context only: a whole tree when it fits ``micro_batch_tokens``, else its rollouts
  (branches) in groups that fit, each group with its ancestors as context. Every trained
  node is trained in exactly one row. Groups of several trees share a row (first fit);
- :func:`build_row` lays a row out: node segments in tree order, position ids that restart
  at each tree (a token's position is its index in its own path's context), and an
  attention mask where a token sees the tokens of its own node before it and every token
  of its ancestors, nothing else. So one forward pass over a row computes, for every node,
  exactly the log-probabilities it would get as one sequence ``context(parent) + node``
  (tested against unpacked forwards).

Nothing here imports torch at module import; rows are built as torch tensors on demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trace_gym.tree import ROOT, RolloutTree

#: Loss aggregation modes: how per-token losses are weighted into one scalar.
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class TokenNode:
    """One node of a :class:`TokenTree`.

    Attributes:
        parent: index of the parent node, ``-1`` for the root (the prompt).
        token_ids: the node's policy tokens, then its observation tokens.
        n_policy: how many leading ``token_ids`` the policy generated (loss mask 1).
        terms: ``(sequence, advantage)`` per sequence of the objective that holds the
            node's policy tokens: one per leaf below it for path advantages (each leaf's
            path is a sequence), one (its rollout) for node advantages; empty for the root.
        sampling_logprobs: the engine's sampling logprobs of the policy tokens (nats),
            ``n_policy`` of them, or empty when not recorded.
        rollout: the rollout (branch) that generated the node, ``-1`` for the root; rows
            are split between rollouts when a tree does not fit one.
    """

    parent: int
    token_ids: tuple[int, ...]
    n_policy: int
    terms: tuple[tuple[int, float], ...] = ()
    sampling_logprobs: tuple[float, ...] = ()
    rollout: int = -1

    @property
    def advantage(self) -> float:
        """The total advantage a policy token carries at ratio 1 (the sum of the terms)."""
        return float(sum(a for _, a in self.terms))


@dataclass(frozen=True)
class TokenTree:
    """One prompt's rollout tree as token segments, parents before children."""

    nodes: tuple[TokenNode, ...]

    @property
    def policy_tokens(self) -> int:
        return sum(n.n_policy for n in self.nodes)


def token_tree(tree: RolloutTree, advantages: Any) -> TokenTree:
    """Convert a finished :class:`RolloutTree` and its advantages (from
    :mod:`trace_gym.train.advantages`: :class:`~trace_gym.train.advantages.PathAdvantages` or
    ``{node id: A}``) into a :class:`TokenTree`.

    The root's tokens are the prompt (observation, never trained); every other node's are
    ``policy_token_ids + observation_token_ids``. Path advantages give a node one term per
    leaf below it (each leaf's path a sequence); node advantages one term, its rollout.

    Raises:
        ValueError: a node (or, for path advantages, a leaf) without an advantage, or an
            advantage that is not finite.
    """
    from trace_gym.train.advantages import PathAdvantages

    per_leaf = isinstance(advantages, PathAdvantages)
    given = advantages.leaves if per_leaf else advantages
    for k, a in given.items():
        if not math.isfinite(float(a)):
            raise ValueError(f"tree {tree.task_id!r}: node {k} has advantage {a!r}")
    terms: dict[int, list[tuple[int, float]]] = {n.id: [] for n in tree.nodes}
    if per_leaf:
        for leaf in tree.leaves():
            if leaf.id not in given:
                raise ValueError(f"tree {tree.task_id!r}: leaf {leaf.id} has no advantage "
                                 f"(got leaves {sorted(given)[:8]})")
            for v in tree.path(leaf.id)[1:]:
                terms[v].append((leaf.id, float(given[leaf.id])))
    nodes = []
    for n in tree.nodes:
        if n.id == ROOT:
            nodes.append(TokenNode(-1, tuple(n.observation_token_ids), 0))
            continue
        if not per_leaf:
            if n.id not in given:
                raise ValueError(f"tree {tree.task_id!r}: node {n.id} has no advantage (got keys {sorted(given)[:8]})")
            terms[n.id] = [(int(n.branch), float(given[n.id]))]
        nodes.append(TokenNode(int(n.parent), tuple(n.policy_token_ids) + tuple(n.observation_token_ids),
                               len(n.policy_token_ids), tuple(terms[n.id]), tuple(n.logprobs), n.branch))
    return TokenTree(tuple(nodes))


@dataclass(frozen=True)
class Coefficients:
    """What each policy token of one node carries into the loss (see :func:`node_coefficients`).

    Attributes:
        pos: ``sum of c_s A_s`` over the node's sequences with ``A_s > 0``.
        neg: ``sum of c_s A_s`` over those with ``A_s < 0``.
        weight: ``sum of c_s`` over all its sequences: the token's weight in the aggregated
            mean (what the KL term is multiplied by).
    """

    pos: float = 0.0
    neg: float = 0.0
    weight: float = 0.0

    @property
    def trained(self) -> bool:
        """Whether the node's tokens carry any policy-gradient term."""
        return self.pos != 0.0 or self.neg != 0.0


def node_coefficients(trees: Sequence[TokenTree], aggregation: str,
                      norm_tokens: int | None = None) -> list[list[Coefficients]]:
    """Per tree, per node: the coefficients every policy token of the node carries.

    The loss is ``sum over policy tokens t, over the sequences s holding t, of
    c_s * l_s(t)`` with ``l_s(t) = -min(r_t A_s, clip(r_t) A_s)``, which
    :func:`~trace_gym.train.trainer.ppo_clip_loss` computes once per token from
    ``pos = sum_{A_s > 0} c_s A_s`` and ``neg = sum_{A_s < 0} c_s A_s``. A sequence is a
    leaf's path for path advantages (a shared prefix counts once per leaf below it, exactly
    as training each path on its own would), a rollout's own tokens for node advantages.
    With ``n_s`` the policy tokens of sequence ``s`` and ``S`` the sequences with policy
    tokens (zero-advantage ones included, as in GRPO), normalised over the whole batch so
    micro-batching never changes the loss:

    - ``token-mean``: ``c_s = 1 / N``, ``N = sum_s n_s``;
    - ``seq-mean-token-mean``: ``c_s = 1 / (S n_s)``;
    - ``seq-mean-token-sum``: ``c_s = 1 / S``;
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): ``c_s = 1 / (S L)``, ``L = norm_tokens``, a
      constant (the configured generation length), not a property of the batch.

    Raises:
        ValueError: an unknown mode, or Dr. GRPO's without ``norm_tokens >= 1``.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; expected one of {LOSS_AGGREGATIONS}")
    if aggregation == "seq-mean-token-sum-norm" and not (norm_tokens and norm_tokens >= 1):
        raise ValueError(f"seq-mean-token-sum-norm divides by a constant L (loss_norm_tokens, the configured "
                         f"generation length), got {norm_tokens!r}")
    seq_len: dict[tuple[int, int], int] = {}
    for t, tree in enumerate(trees):
        for n in tree.nodes:
            if n.n_policy:
                for s, _ in n.terms:
                    seq_len[(t, s)] = seq_len.get((t, s), 0) + n.n_policy
    total, sequences = sum(seq_len.values()), len(seq_len)

    def c(t: int, s: int) -> float:
        if aggregation == "token-mean":
            return 1.0 / total
        if aggregation == "seq-mean-token-mean":
            return 1.0 / (sequences * seq_len[(t, s)])
        if aggregation == "seq-mean-token-sum":
            return 1.0 / sequences
        return 1.0 / (sequences * norm_tokens)  # type: ignore[operator]

    out: list[list[Coefficients]] = []
    for t, tree in enumerate(trees):
        row = []
        for n in tree.nodes:
            if not n.n_policy:
                row.append(Coefficients())
                continue
            cs = [(c(t, s), a) for s, a in n.terms]
            row.append(Coefficients(pos=sum(w * a for w, a in cs if a > 0), neg=sum(w * a for w, a in cs if a < 0),
                                    weight=sum(w for w, _ in cs)))
        out.append(row)
    return out


def _closure(tree: TokenTree, nodes: Sequence[int]) -> list[int]:
    """``nodes`` plus all their ancestors, sorted (parents before children)."""
    keep: set[int] = set()
    for v in nodes:
        while v >= 0 and v not in keep:
            keep.add(v)
            v = tree.nodes[v].parent
    return sorted(keep)


def _row_tokens(tree: TokenTree, nodes: Sequence[int]) -> int:
    """Tokens a unit occupies in a row: full segments for nodes with a child in the unit,
    policy tokens only for the others (their observation precedes nothing trained)."""
    inner = {tree.nodes[v].parent for v in nodes}
    return sum(len(tree.nodes[v].token_ids) if v in inner else tree.nodes[v].n_policy for v in nodes)


@dataclass(frozen=True)
class Unit:
    """Part of one tree in a row: ``nodes`` (sorted, ancestor-closed), of which ``trained``
    are trained; ``tokens`` is its size in the row."""

    tree: int
    nodes: tuple[int, ...]
    trained: frozenset[int]
    tokens: int


def plan_rows(trees: Sequence[TokenTree], trained: Sequence[Sequence[bool]], budget: int) -> list[list[Unit]]:
    """Assign every node flagged in ``trained`` to exactly one row of at most ``budget`` tokens.

    Per tree: the whole tree is one unit when it fits, else its rollouts are grouped in
    creation order, each group growing while its ancestor-closed token count fits (a single
    rollout larger than ``budget`` still forms its own unit: memory is then bounded by the
    longest rollout). Units are placed first-fit by decreasing size.
    """
    if budget < 1:
        raise ValueError(f"micro_batch_tokens must be >= 1, got {budget}")
    units: list[Unit] = []
    for t, (tree, flags) in enumerate(zip(trees, trained, strict=True)):
        chosen = [v for v, f in enumerate(flags) if f and tree.nodes[v].n_policy]
        if not chosen:
            continue
        whole = _closure(tree, chosen)
        size = _row_tokens(tree, whole)
        if size <= budget:
            units.append(Unit(t, tuple(whole), frozenset(chosen), size))
            continue
        by_seq: dict[int, list[int]] = {}
        for v in chosen:
            by_seq.setdefault(tree.nodes[v].rollout, []).append(v)
        group: list[int] = []
        for seq in sorted(by_seq):
            trial = _closure(tree, group + by_seq[seq])
            if group and _row_tokens(tree, trial) > budget:
                closed = _closure(tree, group)
                units.append(Unit(t, tuple(closed), frozenset(group), _row_tokens(tree, closed)))
                group = []
            group = group + by_seq[seq]
        closed = _closure(tree, group)
        units.append(Unit(t, tuple(closed), frozenset(group), _row_tokens(tree, closed)))
    rows: list[list[Unit]] = []
    sizes: list[int] = []
    for unit in sorted(units, key=lambda u: -u.tokens):
        for r, used in enumerate(sizes):
            if used + unit.tokens <= budget:
                rows[r].append(unit)
                sizes[r] += unit.tokens
                break
        else:
            rows.append([unit])
            sizes.append(unit.tokens)
    return rows


@dataclass
class Row:
    """One packed micro-batch (tensors on CPU).

    Attributes:
        input_ids, position_ids: ``[L]``.
        node_index: ``[L]`` row-local node of each token; ``ancestors`` ``[n, n]`` bool,
            ``ancestors[i, j]`` iff row node ``j`` is node ``i`` or one of its ancestors.
        targets: ``[T]`` row positions of the trained tokens; ``predictors`` ``[T]`` the
            positions whose logits predict them (the previous token on their path).
        pos, neg, weights: ``[T]`` float64, each trained token's :class:`Coefficients`.
        sampling_logprobs (NaN where unknown): ``[T]`` float32.
        slots: ``[T]`` the tokens' indices in the step's flat token order (for logprobs
            kept across passes).
    """

    input_ids: Any
    position_ids: Any
    node_index: Any
    ancestors: Any
    targets: Any
    predictors: Any
    pos: Any
    neg: Any
    weights: Any
    sampling_logprobs: Any
    slots: Any

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def attention_mask(self, device: Any = None):
        """``[1, 1, L, L]`` bool: a token sees its ancestors' tokens and its own node's up to itself."""
        import torch

        node = self.node_index.to(device)
        anc = self.ancestors.to(device)
        length = len(self)
        mask = anc[node][:, node] & torch.ones(length, length, dtype=torch.bool, device=device).tril()
        return mask[None, None]


def build_row(trees: Sequence[TokenTree], units: Sequence[Unit], coefficients: Sequence[Sequence[Coefficients]],
              slot_base: Mapping[tuple[int, int], int]) -> Row:
    """Lay out ``units`` as one :class:`Row`. ``coefficients`` come from
    :func:`node_coefficients`; ``slot_base[(tree, node)]`` is the flat index of the node's
    first policy token in the step's token order."""
    import torch

    ids: list[int] = []
    pos: list[int] = []
    node_of: list[int] = []
    parents: list[int] = []
    targets, predictors, pos_, neg_, wts, samp, slots = [], [], [], [], [], [], []
    for unit in units:
        tree = trees[unit.tree]
        local: dict[int, int] = {}
        last_index: dict[int, int] = {}  # node -> row index of the last token on its path
        pos_end: dict[int, int] = {}
        inner = {tree.nodes[v].parent for v in unit.nodes}
        for v in unit.nodes:
            node = tree.nodes[v]
            local[v] = len(parents)
            parents.append(local[node.parent] if node.parent >= 0 else -1)
            tokens = node.token_ids if v in inner else node.token_ids[: node.n_policy]
            start, p0 = len(ids), (pos_end[node.parent] if node.parent >= 0 else 0)
            prev = last_index.get(node.parent, -1) if node.parent >= 0 else -1
            ids.extend(tokens)
            pos.extend(range(p0, p0 + len(tokens)))
            node_of.extend([local[v]] * len(tokens))
            pos_end[v] = p0 + len(node.token_ids)
            last_index[v] = start + len(tokens) - 1 if tokens else prev
            if v in unit.trained:
                if prev < 0:
                    raise ValueError(f"node {v} of tree {unit.tree} has no context token before it")
                for k in range(node.n_policy):
                    targets.append(start + k)
                    predictors.append(prev if k == 0 else start + k - 1)
                    coef = coefficients[unit.tree][v]
                    pos_.append(coef.pos)
                    neg_.append(coef.neg)
                    wts.append(coef.weight)
                    samp.append(node.sampling_logprobs[k] if node.sampling_logprobs else math.nan)
                    slots.append(slot_base[(unit.tree, v)] + k)
    n = len(parents)
    ancestors = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        ancestors[i, i] = True
        if p >= 0:
            ancestors[i] |= ancestors[p]
    return Row(
        input_ids=torch.tensor(ids, dtype=torch.long), position_ids=torch.tensor(pos, dtype=torch.long),
        node_index=torch.tensor(node_of, dtype=torch.long), ancestors=ancestors,
        targets=torch.tensor(targets, dtype=torch.long), predictors=torch.tensor(predictors, dtype=torch.long),
        pos=torch.tensor(pos_, dtype=torch.float64), neg=torch.tensor(neg_, dtype=torch.float64),
        weights=torch.tensor(wts, dtype=torch.float64),
        sampling_logprobs=torch.tensor(samp, dtype=torch.float32), slots=torch.tensor(slots, dtype=torch.long),
    )


def slot_bases(trees: Sequence[TokenTree]) -> tuple[dict[tuple[int, int], int], int]:
    """Flat index of each node's first policy token (tree order), and the total count."""
    base: dict[tuple[int, int], int] = {}
    cursor = 0
    for t, tree in enumerate(trees):
        for v, node in enumerate(tree.nodes):
            base[(t, v)] = cursor
            cursor += node.n_policy
    return base, cursor
