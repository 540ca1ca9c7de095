"""Token batches over rollout trees: each tree edge once, packed into micro-batches by token count.

The trainer never flattens a tree into one sequence per leaf (which would train a shared
prefix once per leaf and encode it as many times). Instead a micro-batch is one *packed
row* holding whole trees, or parts of trees, in which every node's tokens appear once:

- a :class:`TokenTree` is one prompt's tree as token segments: per node its policy tokens
  (loss mask 1) then its observation tokens (loss mask 0; for the root, the prompt), the
  advantage every policy token of the node carries, and the engine's sampling logprobs;
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
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class TokenNode:
    """One node of a :class:`TokenTree`.

    Attributes:
        parent: index of the parent node, ``-1`` for the root (the prompt).
        token_ids: the node's policy tokens, then its observation tokens.
        n_policy: how many leading ``token_ids`` the policy generated (loss mask 1).
        advantage: the advantage each policy token carries (0 for the root).
        sampling_logprobs: the engine's sampling logprobs of the policy tokens (nats),
            ``n_policy`` of them, or empty when not recorded.
        sequence: the rollout (branch) that generated the node; ``-1`` for the root. The
            ``seq-mean-*`` aggregations treat one rollout's own tokens as one sequence.
    """

    parent: int
    token_ids: tuple[int, ...]
    n_policy: int
    advantage: float
    sampling_logprobs: tuple[float, ...] = ()
    sequence: int = -1


@dataclass(frozen=True)
class TokenTree:
    """One prompt's rollout tree as token segments, parents before children."""

    nodes: tuple[TokenNode, ...]

    @property
    def policy_tokens(self) -> int:
        return sum(n.n_policy for n in self.nodes)


def token_tree(tree: RolloutTree, advantages: Mapping[int, float]) -> TokenTree:
    """Convert a finished :class:`RolloutTree` and its per-node advantages (from
    :mod:`trace_gym.advantages`) into a :class:`TokenTree`.

    The root's tokens are the prompt (observation, never trained); every other node's are
    ``policy_token_ids + observation_token_ids``. Raises ``ValueError`` when a node with
    policy tokens has no advantage, or an advantage is not finite.
    """
    nodes = []
    for n in tree.nodes:
        if n.id == ROOT:
            nodes.append(TokenNode(-1, tuple(n.observation_token_ids), 0, 0.0))
            continue
        if n.id not in advantages:
            raise ValueError(f"tree {tree.task_id!r}: node {n.id} has no advantage (got keys {sorted(advantages)[:8]})")
        a = float(advantages[n.id])
        if not math.isfinite(a):
            raise ValueError(f"tree {tree.task_id!r}: node {n.id} has advantage {a!r}")
        nodes.append(TokenNode(int(n.parent), tuple(n.policy_token_ids) + tuple(n.observation_token_ids),
                               len(n.policy_token_ids), a, tuple(n.logprobs), n.branch))
    return TokenTree(tuple(nodes))


def node_weights(trees: Sequence[TokenTree], aggregation: str, norm_tokens: int | None = None) -> list[list[float]]:
    """Per tree, per node: the weight of each of the node's policy tokens in the loss.

    The loss is ``sum_t weight_t * loss_t`` over all policy tokens of ``trees`` (zero-advantage
    ones included in the normalisers, as in GRPO), so micro-batching never changes it:

    - ``token-mean``: ``1 / N``, N the policy tokens of all trees;
    - ``seq-mean-token-mean``: ``1 / (S * n_s)``, S the sequences (rollouts with policy
      tokens), n_s the policy tokens of the token's own sequence;
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): ``1 / (S * L)`` with L = ``norm_tokens``, or
      the longest sequence's policy tokens when ``norm_tokens`` is ``None`` or 0.
    """
    if aggregation not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; expected one of {LOSS_AGGREGATIONS}")
    seq_len: dict[tuple[int, int], int] = {}
    for t, tree in enumerate(trees):
        for n in tree.nodes:
            if n.n_policy:
                seq_len[(t, n.sequence)] = seq_len.get((t, n.sequence), 0) + n.n_policy
    total, sequences = sum(seq_len.values()), len(seq_len)
    out: list[list[float]] = []
    for t, tree in enumerate(trees):
        row = []
        for n in tree.nodes:
            if not n.n_policy:
                row.append(0.0)
            elif aggregation == "token-mean":
                row.append(1.0 / total)
            elif aggregation == "seq-mean-token-mean":
                row.append(1.0 / (sequences * seq_len[(t, n.sequence)]))
            else:
                norm = norm_tokens or max(seq_len.values())
                row.append(1.0 / (sequences * norm))
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
            by_seq.setdefault(tree.nodes[v].sequence, []).append(v)
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
        advantages, weights, sampling_logprobs (NaN where unknown): ``[T]`` float32.
        slots: ``[T]`` the tokens' indices in the step's flat token order (for logprobs
            kept across passes).
    """

    input_ids: Any
    position_ids: Any
    node_index: Any
    ancestors: Any
    targets: Any
    predictors: Any
    advantages: Any
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


def build_row(trees: Sequence[TokenTree], units: Sequence[Unit], weights: Sequence[Sequence[float]],
              slot_base: Mapping[tuple[int, int], int]) -> Row:
    """Lay out ``units`` as one :class:`Row`. ``slot_base[(tree, node)]`` is the flat index
    of the node's first policy token in the step's token order."""
    import torch

    ids: list[int] = []
    pos: list[int] = []
    node_of: list[int] = []
    parents: list[int] = []
    targets, predictors, adv, wts, samp, slots = [], [], [], [], [], []
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
                    adv.append(node.advantage)
                    wts.append(weights[unit.tree][v])
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
        advantages=torch.tensor(adv, dtype=torch.float32), weights=torch.tensor(wts, dtype=torch.float64),
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
