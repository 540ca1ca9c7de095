"""Rollout trees: one node per completed turn, leaves carry the episode's reward.

A tree belongs to one prompt. Its root (node 0, depth 0) is the prompt itself: the
history H_0 = x, with the prompt's tokens as observation tokens (loss mask 0). Every
other node is one completed turn t = (thought, action, observation): the policy's
tokens for the turn (loss mask 1), the observation tokens the env returned (mask 0),
the sampling logprobs, and the env snapshot *after* the turn, which is where a
continuation restarts. A node's depth is its turn index t (root = 0), so a node at
depth t holds the history H_t. A leaf is a node whose episode ended; it carries the
reward. A node's context is the concatenation of the segments on its path.

Every rollout (a full rollout from the root, or a continuation from a deeper node)
is a *branch*: ``start_branch(anchor)`` opens one and ``add_turn(parent, ..., branch=b)``
appends its turns. Branches that start at the root are root rollouts; branches that
start deeper are continuations (``Node.is_continuation``).

Definitions used throughout (the method page's words, made exact here):

- success: a leaf with ``reward >= SUCCESS_THRESHOLD`` (0.5); failure otherwise.
  With the outcome rewards of RLVR (0 or 1) that is simply r = 1 vs r = 0.
- mixed (``is_mixed``): the tree has at least one success leaf and one failure leaf;
  the effective ratio of a batch is the fraction of its trees that are mixed.
- contrast pair: an unordered pair of leaves {a, b}, one success and one failure.
  Its anchor is their deepest common ancestor (the lowest common ancestor; leaves
  never have children, so it is a proper ancestor of both). Every contrast pair has
  exactly one anchor, so ``contrast_pairs()`` partitions all S * F pairs of the tree
  (S successes, F failures) by the anchor's depth.
- target (``targets``): the predictor's regression target for a node. Two estimators:

  * ``"recursive"`` (the default), the *recursive mean*: a leaf's target is its
    reward (with ``outcomes=True``, what the predictor regresses, its outcome: 1.0 for
    a success, else 0.0, so an env whose rewards leave [0, 1], such as GEM's -0.1 for
    a format error, or give partial credit, still gives targets in [0, 1]); an inner node's target is the unweighted mean of its children's targets.
    Each child is one independently sampled next turn from the node's history, so
    each counts once however many leaves were later grown below it. The pooled mean
    of the leaves below a node (``pooled_targets``, kept for comparison) instead
    weights a child by its number of leaves; since TRACE expands where a flip of the
    *observed* outcome is likely, the expanded subtrees are exactly those below
    observed failures (or successes), and the pooled mean over-weights them. The
    recursive mean removes that weighting, but a node that was expanded still counts
    the original child whose observed outcome triggered the expansion (a node with
    value V whose one rollout gets k continuations there only when it failed has
    E[target] = V + (1 - V) k V / (k + 1)).
  * ``"fresh"``: the same, except that at an *expanded* node (one with children
    from continuations anchored there) the target is the mean over those fresh
    continuations only, without the pass-through child of the rollout whose outcome
    triggered the expansion. Fresh continuations are drawn after the decision and
    independently of the outcome behind it, so the target is unbiased for V at the
    expanded node itself. Above it, which rollouts got expanded still depended on
    their outcomes, so ancestors are not exactly unbiased either.

  Which estimator is closer to the true V, at prompt and prefix depth, is measured
  on the simulator (``trace_gym.sim.targets.target_error_study``).

Nothing here knows about tokenizers, engines or environments; the snapshot is an
opaque object, never serialised (``to_json`` drops it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

#: A leaf with ``reward >= SUCCESS_THRESHOLD`` counts as a success.
SUCCESS_THRESHOLD = 0.5

ROOT = 0  #: id of the root node of every tree

#: The target estimators of :meth:`RolloutTree.targets`.
TARGET_ESTIMATORS = ("recursive", "fresh")


@dataclass(eq=False, slots=True)
class Node:
    """One completed turn (or, for ``id == 0``, the prompt).

    Attributes:
        id: index of the node in ``RolloutTree.nodes``.
        parent: parent node id, ``None`` for the root.
        depth: turn index t of the history this node ends (root = 0).
        branch: id of the rollout (branch) that generated this node; the root has -1.
        is_continuation: True when that branch is a continuation started below the
            root (a replay from a saved prefix), False for root rollouts and the root.
        policy_token_ids: tokens the policy generated this turn (loss mask 1).
        observation_token_ids: tokens appended after them: the env's observation
            rendered as a chat-template delta (loss mask 0). For the root: the prompt.
        logprobs: per policy token sampling log-probabilities (nats), same length
            as ``policy_token_ids`` (or empty when not recorded).
        text: decoded text of the turn (for inspection only).
        snapshot: the env snapshot after the turn (opaque, not serialised).
        reward: the episode's reward at a leaf, ``None`` elsewhere.
        terminal: True when the episode ended at this node (it is a leaf).
        info: JSON-friendly extras (tool calls, truncation flags, ...).
        children: ids of the child nodes, in creation order.
    """

    id: int
    parent: int | None
    depth: int
    branch: int = -1
    is_continuation: bool = False
    policy_token_ids: tuple[int, ...] = ()
    observation_token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    text: str = ""
    snapshot: Any = None
    reward: float | None = None
    terminal: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    children: list[int] = field(default_factory=list)

    @property
    def success(self) -> bool:
        """Leaf reward at or above :data:`SUCCESS_THRESHOLD`; False for non-leaves."""
        return self.terminal and self.reward is not None and self.reward >= SUCCESS_THRESHOLD

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent": self.parent,
            "depth": self.depth,
            "branch": self.branch,
            "is_continuation": self.is_continuation,
            "policy_token_ids": list(self.policy_token_ids),
            "observation_token_ids": list(self.observation_token_ids),
            "logprobs": list(self.logprobs),
            "text": self.text,
            "reward": self.reward,
            "terminal": self.terminal,
            "info": self.info,
            "children": list(self.children),
        }


@dataclass(frozen=True, slots=True)
class Branch:
    """One rollout: a root rollout (``anchor == 0``) or a continuation from ``anchor``."""

    id: int
    anchor: int
    is_continuation: bool


def prefix_depths(turns: int, cap: int | None) -> list[int]:
    """The prefix depths recorded for a root of ``turns`` turns: 1..turns-1, or ``cap`` of them evenly
    spaced (first and last included) when there are more.

    >>> prefix_depths(10, 3)
    [1, 5, 9]
    """
    depths = list(range(1, max(turns, 1)))
    if cap is None or len(depths) <= cap:
        return depths
    if cap == 1:
        return depths[:1]
    step = (len(depths) - 1) / (cap - 1)  # numpy.linspace's points, rounded half to even as numpy.round
    return [depths[round(i * step)] for i in range(cap)]


class RolloutTree:
    """The rollout tree of one prompt.

    Build it by appending turns: ``b = tree.start_branch(anchor)`` then, turn by turn,
    ``node = tree.add_turn(parent, policy_token_ids=..., observation_token_ids=...,
    snapshot=..., branch=b)`` with ``reward=..., terminal=True`` on the last turn.

    Args:
        task_id: id of the prompt's ``Task`` (for reports and JSON).
        prompt_token_ids: the prompt's tokens (root observation segment, mask 0).
        snapshot: env snapshot at reset (the state a root rollout starts from).
        text: the prompt text, for inspection.
    """

    def __init__(
        self,
        task_id: str = "",
        prompt_token_ids: tuple[int, ...] | list[int] = (),
        snapshot: Any = None,
        text: str = "",
    ) -> None:
        self.task_id = task_id
        self.nodes: list[Node] = [
            Node(id=ROOT, parent=None, depth=0, observation_token_ids=tuple(prompt_token_ids),
                 snapshot=snapshot, text=text)
        ]
        self.branches: list[Branch] = []
        self._branch_leaf: dict[int, int] = {}

    # ------------------------------------------------------------------ building
    @property
    def root(self) -> Node:
        return self.nodes[ROOT]

    def node(self, node_id: int) -> Node:
        if not 0 <= node_id < len(self.nodes):
            raise KeyError(f"no node {node_id!r} in a tree of {len(self.nodes)} nodes")
        return self.nodes[node_id]

    def start_branch(self, anchor: int = ROOT) -> int:
        """Open a rollout starting after node ``anchor``; returns its branch id.

        A branch from the root is a root rollout; from any deeper node it is a
        continuation (nominal cost 1/2 in the ledger's convention).
        """
        anchor_node = self.node(anchor)
        if anchor_node.terminal:
            raise ValueError(f"cannot branch from node {anchor}: its episode already ended")
        b = Branch(id=len(self.branches), anchor=anchor, is_continuation=anchor != ROOT)
        self.branches.append(b)
        return b.id

    def add_turn(
        self,
        parent: int,
        *,
        branch: int,
        policy_token_ids: tuple[int, ...] | list[int] = (),
        observation_token_ids: tuple[int, ...] | list[int] = (),
        logprobs: tuple[float, ...] | list[float] = (),
        text: str = "",
        snapshot: Any = None,
        reward: float | None = None,
        terminal: bool = False,
        info: dict[str, Any] | None = None,
    ) -> int:
        """Append one completed turn below ``parent``; returns the new node's id.

        ``terminal=True`` ends the episode and needs a ``reward``.
        """
        p = self.node(parent)
        if p.terminal:
            raise ValueError(f"node {parent} is a leaf (episode ended); cannot add a turn below it")
        if not 0 <= branch < len(self.branches):
            raise ValueError(f"unknown branch {branch!r}; open one with start_branch() first")
        if terminal and reward is None:
            raise ValueError(f"terminal turn below node {parent} needs a reward, got None")
        if not terminal and reward is not None:
            raise ValueError(f"reward {reward!r} given for a non-terminal turn below node {parent}")
        if logprobs and len(logprobs) != len(policy_token_ids):
            raise ValueError(
                f"logprobs has {len(logprobs)} entries for {len(policy_token_ids)} policy tokens"
            )
        node = Node(
            id=len(self.nodes),
            parent=parent,
            depth=p.depth + 1,
            branch=branch,
            is_continuation=self.branches[branch].is_continuation,
            policy_token_ids=tuple(policy_token_ids),
            observation_token_ids=tuple(observation_token_ids),
            logprobs=tuple(logprobs),
            text=text,
            snapshot=snapshot,
            reward=None if reward is None else float(reward),
            terminal=terminal,
            info=dict(info or {}),
        )
        self.nodes.append(node)
        p.children.append(node.id)
        if terminal:
            self._branch_leaf[branch] = node.id
        return node.id

    # ------------------------------------------------------------------ structure
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def leaves(self) -> list[Node]:
        """All finished episodes (terminal nodes), in creation order."""
        return [n for n in self.nodes if n.terminal]

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to ``node_id`` (inclusive)."""
        out = []
        cur: int | None = node_id
        while cur is not None:
            out.append(cur)
            cur = self.node(cur).parent
        return out[::-1]

    def context(self, node_id: int) -> tuple[list[int], list[int]]:
        """The token context of ``node_id`` and its loss mask (1 = policy token).

        The concatenation, root to node, of each node's policy tokens (mask 1) then
        observation tokens (mask 0). A continuation from the node generates after it.
        """
        tokens, mask, _ = self.path_tokens(node_id)
        return tokens, mask

    def path_tokens(self, node_id: int) -> tuple[list[int], list[int], list[float]]:
        """One episode's training view, root to ``node_id`` (a leaf for a whole episode).

        Returns ``(token_ids, loss_mask, logprobs)``, all the same length: the tokens
        of :meth:`context`, the loss mask (1 on policy tokens) and, per token, the
        sampling log-probability (nats) of a policy token, 0.0 on observation tokens,
        and NaN on a policy token whose logprobs were not recorded (never a silent 0).
        """
        tokens: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        for i in self.path(node_id):
            n = self.nodes[i]
            tokens += n.policy_token_ids
            mask += [1] * len(n.policy_token_ids)
            logprobs += list(n.logprobs) if n.logprobs else [float("nan")] * len(n.policy_token_ids)
            tokens += n.observation_token_ids
            mask += [0] * len(n.observation_token_ids)
            logprobs += [0.0] * len(n.observation_token_ids)
        return tokens, mask, logprobs

    def edges(self) -> list[tuple[int, int]]:
        """Every (parent, child) edge once, in creation order.

        The trainer trains each edge once: the child's policy tokens given the
        parent's context. Shared prefixes are therefore never trained twice.
        """
        return [(n.parent, n.id) for n in self.nodes[1:] if n.parent is not None]

    def is_complete(self) -> bool:
        """Every branch ended: each childless non-root node is a leaf."""
        return all(n.terminal or n.children for n in self.nodes[1:]) and all(
            self.branch_leaf(b.id) is not None for b in self.branches
        )

    def branch_leaf(self, branch: int) -> int | None:
        """The leaf that ended ``branch``, or ``None`` while it is still running."""
        return self._branch_leaf.get(branch)

    def branch_nodes(self, branch: int) -> list[int]:
        """Ids of the nodes ``branch`` generated, in order (its anchor excluded)."""
        return [n.id for n in self.nodes if n.branch == branch]

    def expansion_candidates(self) -> list[tuple[int, float]]:
        """The visited prefixes a continuation may start from, with observed rewards.

        Per the method page: for each finished *root* rollout j and each of its
        non-terminal turns t >= 1 (history H_jt), the pair (node id, r_j) where r_j is
        the reward rollout j ended with. Ordered by rollout, then depth. The root
        itself is not a prefix (a replay from it is a fresh root rollout).
        """
        out: list[tuple[int, float]] = []
        for b in self.branches:
            if b.is_continuation:
                continue
            leaf = self.branch_leaf(b.id)
            if leaf is None:
                raise ValueError(f"root rollout {b.id} has not finished; expand after it ends")
            reward = self.nodes[leaf].reward
            out.extend((i, float(reward)) for i in self.branch_nodes(b.id) if not self.nodes[i].terminal)
        return out

    # ------------------------------------------------------------------ outcomes
    def root_outcomes(self) -> tuple[int, int]:
        """``(successes, trials)`` over the finished root rollouts: independent samples of the
        prompt's success (continuations are not: where they start depends on outcomes)."""
        leaves = [self.branch_leaf(b.id) for b in self.branches if not b.is_continuation]
        ended = [self.nodes[leaf] for leaf in leaves if leaf is not None]
        return sum(n.success for n in ended), len(ended)

    def is_mixed(self) -> bool:
        """The tree holds at least one success and one failure leaf."""
        s = [n.success for n in self.leaves()]
        return any(s) and not all(s)

    def _leaf_counts(self) -> tuple[list[int], list[int]]:
        """Per node: number of success and failure leaves in its subtree."""
        succ = [0] * len(self.nodes)
        fail = [0] * len(self.nodes)
        for n in reversed(self.nodes):  # children always have larger ids
            if n.terminal:
                if n.success:
                    succ[n.id] = 1
                else:
                    fail[n.id] = 1
            if n.parent is not None:
                succ[n.parent] += succ[n.id]
                fail[n.parent] += fail[n.id]
        return succ, fail

    def contrast_pairs_by_anchor(self) -> dict[int, int]:
        """Anchor node id -> number of contrast pairs anchored there (non-zero only).

        Pairs anchored at v = S_v F_v - sum_c S_c F_c over v's children c (pairs with
        both leaves below one child are anchored deeper).
        """
        succ, fail = self._leaf_counts()
        out: dict[int, int] = {}
        for n in self.nodes:
            if n.terminal:
                continue
            pairs = succ[n.id] * fail[n.id] - sum(succ[c] * fail[c] for c in n.children)
            if pairs:
                out[n.id] = pairs
        return out

    def contrast_pairs(self) -> dict[int, int]:
        """Anchor depth -> number of contrast pairs whose deepest common ancestor is there.

        Depth 0 pairs come from different root rollouts (the GRPO group contrast);
        depth t >= 1 pairs share the first t turns. Sums to S * F over the tree.
        """
        out: dict[int, int] = {}
        for node_id, pairs in self.contrast_pairs_by_anchor().items():
            d = self.nodes[node_id].depth
            out[d] = out.get(d, 0) + pairs
        return dict(sorted(out.items()))

    def targets(self, estimator: Literal["recursive", "fresh"] = "recursive", *,
                outcomes: bool = False) -> dict[int, float]:
        """Node id -> target (see the module docstring), every node with one.

        Leaves: their reward, or with ``outcomes`` 1.0 when ``success`` else 0.0 (the
        predictor's targets). Inner nodes: the mean of their children's targets; with
        ``estimator="fresh"``, at a node with children from continuations anchored
        there, the mean of those children only. Nodes below which no branch has
        finished are omitted.
        """
        if estimator not in TARGET_ESTIMATORS:
            raise ValueError(f"unknown target estimator {estimator!r}; expected one of {TARGET_ESTIMATORS}")
        fresh_only = estimator == "fresh"
        t: dict[int, float] = {}
        for n in reversed(self.nodes):
            if n.terminal:
                t[n.id] = (1.0 if n.success else 0.0) if outcomes else float(n.reward)  # type: ignore[arg-type]
                continue
            vals = [t[c] for c in n.children if c in t]
            if fresh_only and n.id != ROOT:
                fresh = [t[c] for c in n.children if c in t and self.branches[self.nodes[c].branch].anchor == n.id]
                vals = fresh or vals
            if vals:
                t[n.id] = sum(vals) / len(vals)
        return t

    def pooled_targets(self, *, outcomes: bool = False) -> dict[int, float]:
        """Node id -> plain mean reward (or outcome) of all leaves below it (biased; for comparison)."""
        total = [0.0] * len(self.nodes)
        count = [0] * len(self.nodes)
        for n in reversed(self.nodes):
            if n.terminal:
                total[n.id] += (1.0 if n.success else 0.0) if outcomes else float(n.reward)  # type: ignore[arg-type]
                count[n.id] += 1
            if n.parent is not None:
                total[n.parent] += total[n.id]
                count[n.parent] += count[n.id]
        return {i: total[i] / count[i] for i in range(len(self.nodes)) if count[i]}

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form; snapshots are dropped."""
        return {
            "task_id": self.task_id,
            "nodes": [n.to_dict() for n in self.nodes],
            "branches": [[b.anchor, b.is_continuation] for b in self.branches],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RolloutTree":
        """Inverse of :meth:`to_dict` (every snapshot comes back as ``None``)."""
        tree = cls(task_id=d.get("task_id", ""))
        nodes = d["nodes"]
        if not nodes or nodes[0].get("parent") is not None:
            raise ValueError("tree JSON must start with the root node (parent null)")
        tree.nodes = []
        for i, nd in enumerate(nodes):
            if nd["id"] != i:
                raise ValueError(f"node ids must be 0..n-1 in order; position {i} has id {nd['id']!r}")
            tree.nodes.append(
                Node(
                    id=i,
                    parent=nd["parent"],
                    depth=nd["depth"],
                    branch=nd.get("branch", -1),
                    is_continuation=nd.get("is_continuation", False),
                    policy_token_ids=tuple(nd.get("policy_token_ids", ())),
                    observation_token_ids=tuple(nd.get("observation_token_ids", ())),
                    logprobs=tuple(nd.get("logprobs", ())),
                    text=nd.get("text", ""),
                    reward=nd.get("reward"),
                    terminal=nd.get("terminal", False),
                    info=dict(nd.get("info", {})),
                    children=list(nd.get("children", ())),
                )
            )
        tree.branches = [Branch(i, a, c) for i, (a, c) in enumerate(d.get("branches", []))]
        tree._branch_leaf = {n.branch: n.id for n in tree.nodes if n.terminal}
        return tree

    @classmethod
    def from_json(cls, s: str) -> "RolloutTree":
        return cls.from_dict(json.loads(s))
