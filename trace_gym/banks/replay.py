"""Replaying a bank: the third :class:`~trace_gym.step.driver.BranchRunner`, and the bank's oracle.

:class:`BankBranchRunner` answers the step driver's requests from recorded outcomes,
never from a model:

- root rollout j of prompt i is the next unused recorded root of i, in a seeded
  permutation of its R roots (:class:`BankDraws`: without replacement);
- k continuations from a node (a prefix of a root rollout, after t turns) are the next
  unused recorded continuations of that prefix, in a seeded permutation of its K;
- a request beyond what was recorded is refused, never resampled or invented: the
  branch comes back with ``leaf=None`` and ``error="exhausted"`` and the ledger counts
  it (``BudgetLedger.exhausted``);
- every replayed turn becomes a tree node with the recorded action text and
  observation messages, in the node layout of live rollouts, so a predictor reads
  exactly what it would have read live (:func:`trace_gym.agent.rollout.node_context`); exact
  costs (generated and prefill tokens, env steps, replayed env steps) are the recorded
  ones, charged as the live agent loop charges them (one prefill per group of branches
  that start from one context);
- a prefix the recording left out (the per-root cap) is not offered to the allocators
  (:class:`BankTree`).

The draw state lives in a :class:`BankDraws` that the caller keeps across the steps of
one arm (so a prompt drawn again in a later step gets further unused roots), and the
seeds make every arm of a repetition draw the same recorded rollouts for the same
requests (common random numbers).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from trace_gym.banks.format import BankPrompt
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import BranchResult
from trace_gym.predictor.kinds import Context
from trace_gym.agent.rollout import node_context
from trace_gym.tree import ROOT, RolloutTree

#: The error of a refused branch (the bank holds no unused recorded rollout for it).
EXHAUSTED = "exhausted"


class BankTree(RolloutTree):
    """A replayed tree: a prefix the recording left out is not an expansion candidate."""

    def expansion_candidates(self) -> list[tuple[int, float]]:
        return [(n, r) for n, r in super().expansion_candidates() if self.nodes[n].info["bank"].get("recorded", True)]


def node_info(turn: Mapping[str, Any], bank: Mapping[str, Any]) -> dict[str, Any]:
    """A replayed node's ``info``: the keys a live node has (:class:`trace_gym.agent.rollout.AgentBranchRunner`),
    plus ``bank`` (where in the bank it came from)."""
    info: dict[str, Any] = {"observation": list(turn["observation"]), "finish_reason": turn["finish_reason"]}
    if turn["truncation"]:
        info["truncation"] = turn["truncation"]
    if turn["cached_tokens"] is not None:
        info["cached_tokens"] = turn["cached_tokens"]
    if turn["env_error"] is not None:
        info["env_error"] = turn["env_error"]
    info["bank"] = dict(bank)
    return info


def append_episode(tree: RolloutTree, anchor: int, episode: Mapping[str, Any], bank: Mapping[str, Any],
                   recorded: Sequence[int] = ()) -> int | None:
    """Append a recorded episode below ``anchor`` as one branch; returns its leaf (``None``, and
    no branch, for an episode without turns).

    ``bank`` goes into every node's ``info["bank"]``; nodes of a root rollout also get
    ``recorded``: whether the prefix at their depth was recorded (in ``recorded``).
    """
    if not episode["turns"]:
        return None
    branch = tree.start_branch(anchor)
    node, turns = anchor, episode["turns"]
    for n, turn in enumerate(turns):
        last = n == len(turns) - 1
        where = dict(bank) if anchor != ROOT else {**bank, "recorded": not last and turn["depth"] in recorded}
        node = tree.add_turn(node, branch=branch, text=turn["action"], reward=episode["reward"] if last else None,
                             terminal=last, info=node_info(turn, where))
    return node


def charge(ledger: BudgetLedger, episodes: Sequence[Mapping[str, Any]], replayed: Sequence[int] = ()) -> None:
    """Charge the recorded exact costs of episodes started together from one context.

    Generated tokens and env steps: every turn's. Prefill: the first turns share one
    request (as in the live loop, where branches with one anchor and one context are one
    request with ``n = k``), so they are charged once (the largest); later turns each.
    ``replayed``: env steps each episode's restore re-executed.
    """
    live = [ep for ep in episodes if ep["turns"]]
    firsts = [ep["turns"][0]["prefill_tokens"] for ep in live]
    later = sum(t["prefill_tokens"] for ep in live for t in ep["turns"][1:])
    ledger.add_tokens(generated=sum(t["policy_tokens"] for ep in live for t in ep["turns"]),
                      prefill=(max(firsts) if firsts else 0) + later)
    ledger.add_env_steps(sum(t["env_steps"] for ep in live for t in ep["turns"]))
    for steps in replayed:
        if steps:
            ledger.add_replayed_env_steps(int(steps))


@functools.lru_cache(maxsize=1 << 16)
def _permutation(seed: tuple[int, ...], n: int) -> tuple[int, ...]:
    """``np.random.default_rng(seed).permutation(n)`` as Python ints, made once per process
    (every arm of a repetition draws in the same orders; a Generator costs tens of microseconds)."""
    return tuple(np.random.default_rng(list(seed)).permutation(n).tolist())


@dataclass
class BankDraws:
    """Which recorded rollouts one arm has used (draws without replacement), and what it asked for.

    Root draws of prompt ``i`` follow a permutation seeded by ``(seed, i)``; continuation
    draws of prefix (root j, depth t) one seeded by ``(seed, i, j, t)``; so arms with the
    same ``seed`` get the same recorded rollouts for the same requests.

    Attributes:
        seed: the repetition's seed.
        used_roots, used_continuations: how many of each were handed out.
        requested_roots, requested_continuations: how many were asked for (refused ones
            included): the bank sizes a run like this one needs.
        exhausted: requests refused.
    """

    seed: int
    used_roots: dict[int, int] = field(default_factory=dict)
    used_continuations: dict[tuple[int, int, int], int] = field(default_factory=dict)
    requested_roots: dict[int, int] = field(default_factory=dict)
    requested_continuations: dict[tuple[int, int, int], int] = field(default_factory=dict)
    exhausted: int = 0

    def _draw(self, key: Any, recorded: int, count: int, seed: list[int], used: dict,
              requested: dict) -> list[int | None]:
        requested[key] = requested.get(key, 0) + count
        start = used.get(key, 0)
        order = _permutation(tuple(seed), recorded)
        picks = [order[n] if n < recorded else None for n in range(start, start + count)]
        used[key] = min(start + count, recorded)
        self.exhausted += sum(p is None for p in picks)
        return picks

    def roots(self, prompt: BankPrompt, count: int) -> list[int | None]:
        """Positions of ``count`` unused roots of ``prompt`` (``None`` for each one refused)."""
        return self._draw(prompt.index, len(prompt.roots), count, [self.seed, prompt.index, 0],
                          self.used_roots, self.requested_roots)

    def continuations(self, prompt: BankPrompt, root: int, depth: int, count: int) -> list[int | None]:
        """Positions of ``count`` unused continuations of the prefix (``root``, ``depth``); ``None``
        for each one refused (all of them at a prefix that was not recorded)."""
        p = prompt.prefix(root, depth)
        return self._draw((prompt.index, root, depth), len(p["continuations"]) if p else 0, count,
                          [self.seed, prompt.index, 1, root, depth], self.used_continuations,
                          self.requested_continuations)

    @property
    def roots_needed(self) -> int:
        """The most roots asked of one prompt: the R a bank needs for none to be refused."""
        return max(self.requested_roots.values(), default=0)

    @property
    def continuations_needed(self) -> int:
        """The most continuations asked of one prefix: the K a bank needs."""
        return max(self.requested_continuations.values(), default=0)


@dataclass(frozen=True)
class AnchoredContext(Context):
    """A :class:`~trace_gym.predictor.kinds.Context` that also carries the bank's empirical value of its
    anchor (what :class:`BankOraclePredictor` reads; text predictors read the text fields only)."""

    empirical: float = math.nan


class BankBranchRunner:
    """The :class:`~trace_gym.step.driver.BranchRunner` of a bank (one per step; see the module docstring).

    Candidates are :class:`~trace_gym.banks.format.BankPrompt` records.

    Args:
        draws: the arm's draw state (kept across its steps).
        anchored: hand out :class:`AnchoredContext` (for the oracle) instead of plain contexts.
    """

    def __init__(self, draws: BankDraws, *, anchored: bool = False):
        self.draws = draws
        self.anchored = anchored
        self._records: dict[Hashable, BankPrompt] = {}
        self._trees: dict[Hashable, BankTree] = {}
        self._pending: list[BranchResult] = []
        self._contexts: dict[tuple[Hashable, int], Context] = {}

    def prompt_context(self, candidate: BankPrompt) -> Context:
        if self.anchored:
            return AnchoredContext(candidate.prompt, empirical=candidate.prompt_rate())
        return Context(candidate.prompt)

    def node_context(self, key: Hashable, node_id: int) -> Context:
        # a node's path and texts never change, so its context is made once (scoring and learning both read it)
        known = self._contexts.get((key, node_id))
        if known is None:
            known = self._contexts[(key, node_id)] = self._node_context(key, node_id)
        return known

    def _node_context(self, key: Hashable, node_id: int) -> Context:
        tree, record = self._trees[key], self._records[key]
        ctx = node_context(tree, node_id, record.prompt)
        if not self.anchored:
            return ctx
        return AnchoredContext(ctx.prompt, ctx.history, ctx.depth, empirical=anchor_rate(record, tree, node_id))

    def new_tree(self, key: Hashable, candidate: BankPrompt) -> BankTree:
        self._records[key] = candidate
        self._trees[key] = BankTree(candidate.task_id, text=candidate.prompt)
        return self._trees[key]

    def start_roots(self, key: Hashable, count: int, ledger: BudgetLedger) -> None:
        record, tree = self._records[key], self._trees[key]
        drawn = []
        for pos in self.draws.roots(record, count):
            if pos is None:
                ledger.add_exhausted(1)
                self._pending.append(BranchResult(key, ROOT, None, EXHAUSTED))
            else:
                drawn.append(pos)
        charge(ledger, [record.roots[pos] for pos in drawn])
        for pos in drawn:
            root = record.roots[pos]
            leaf = append_episode(tree, ROOT, root, {"root": pos}, [p["depth"] for p in root["prefixes"]])
            self._finish(key, ROOT, leaf, root["error"], ledger)

    def start_continuations(self, key: Hashable, node_id: int, count: int, ledger: BudgetLedger) -> None:
        record, tree = self._records[key], self._trees[key]
        node = tree.nodes[node_id]
        where = node.info.get("bank", {})
        if "root" not in where or "prefix" in where:  # not a node of a recorded root rollout
            picks: list[int | None] = [None] * count
            self.draws.exhausted += count
        else:
            picks = self.draws.continuations(record, where["root"], node.depth, count)
        drawn = [pos for pos in picks if pos is not None]
        for _ in range(count - len(drawn)):
            ledger.add_exhausted(1)
            self._pending.append(BranchResult(key, node_id, None, EXHAUSTED))
        if not drawn:
            return
        prefix = record.prefix(where["root"], node.depth)
        chosen = [prefix["continuations"][pos] for pos in drawn]
        charge(ledger, chosen, [c.get("replayed_env_steps", 0) for c in chosen])
        for pos, cont in zip(drawn, chosen):
            leaf = append_episode(tree, node_id, cont, {"root": where["root"], "prefix": node.depth,
                                                        "continuation": pos})
            self._finish(key, node_id, leaf, cont["error"], ledger)

    def _finish(self, key: Hashable, anchor: int, leaf: int | None, error: str | None, ledger: BudgetLedger) -> None:
        if error is not None:
            ledger.add_errors(1)
        self._pending.append(BranchResult(key, anchor, leaf, error))

    def advance(self, ledger: BudgetLedger) -> list[BranchResult]:
        out, self._pending = self._pending, []
        return out

    @property
    def live(self) -> int:
        return len(self._pending)

    def cancel(self) -> None:
        self._pending.clear()


def anchor_rate(record: BankPrompt, tree: RolloutTree, node_id: int) -> float:
    """The bank's empirical value of a replayed node: the prompt's rate at the root, a recorded
    prefix's continuation rate (:meth:`BankPrompt.anchor_rate`, with its fallbacks), and for a
    node inside a continuation the rate of the prefix it continues."""
    if node_id == ROOT:
        return record.prompt_rate()
    where = tree.nodes[node_id].info["bank"]
    depth = where["prefix"] if "prefix" in where else tree.nodes[node_id].depth
    return record.anchor_rate(where["root"], depth)


def recorded_prefix_rate(record: BankPrompt, tree: RolloutTree, node_id: int) -> float | None:
    """The empirical rate of a node that is a recorded prefix of a root rollout with a rate of its own,
    else ``None`` (what the prefix Spearman is measured against)."""
    where = tree.nodes[node_id].info.get("bank", {})
    if "prefix" in where or not where.get("recorded"):
        return None
    return record.prefix_rate(where["root"], tree.nodes[node_id].depth)


class BankOraclePredictor:
    """The bank's empirical success rate of each anchor (prompt: the mean over its recorded roots;
    a prefix: the mean over its recorded continuations, with :func:`anchor_rate`'s fallbacks).

    An upper bound, never a headline: it has seen the very outcomes the replay draws.
    It reads :class:`AnchoredContext` (a :class:`BankBranchRunner` built with
    ``anchored=True``) and learns nothing.
    """

    def predict(self, contexts: Sequence[Context]) -> np.ndarray:
        bad = [c for c in contexts if not isinstance(c, AnchoredContext)]
        if bad:
            raise TypeError("the bank oracle reads AnchoredContext (BankBranchRunner(..., anchored=True)); got "
                            f"{type(bad[0]).__name__}")
        return np.clip(np.array([c.empirical for c in contexts], dtype=float), 0.0, 1.0)

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        if len(targets) != len(contexts):
            raise ValueError(f"got {len(targets)} targets for {len(contexts)} contexts")
        return {"loss": math.nan, "n": float(len(contexts))}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
