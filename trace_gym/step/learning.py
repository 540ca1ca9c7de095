"""The learning half of a step: the predictor's regression set from the finished trees, its
update, and the no-contrast warning.

Once every branch of a step is back (:func:`trace_gym.step.driver.run_step`), the predictor
regresses on the trees' recursive-mean targets (:func:`predictor_samples`, contexts through
the runner's ``prompt_context`` / ``node_context``), prefix samples weighted to hold
``prefix_share`` of the batch (:func:`prefix_weight_for_share`; the paper: about 6 %), one
``predictor.update`` (``predictor_update`` phase), each prompt's own root outcomes for a
predictor that keeps per-prompt evidence, and the no-contrast warning when every leaf has
the same outcome (:func:`reward_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_gym.predictor.kinds import ObservesOutcomes, SuccessPredictor
from trace_gym.tree import ROOT, SUCCESS_THRESHOLD, RolloutTree

#: Default share of the predictor's batch weight on prefix samples (the paper: about 6 %).
PREFIX_SHARE = 0.06


@dataclass
class Learning:
    """The learning half of a step (:func:`update_predictor`).

    Attributes:
        contexts: the regression set, what the predictor read (n samples).
        targets: recursive-mean targets in [0, 1], shape (n,).
        weights: 1 for prompt samples, the prefix weight for prefix samples, shape (n,).
        tree_index, node_ids, depths: where each sample sits, int64 (n,).
        prefix_weight: the weight of each prefix sample.
        prefix_predictions: with ``score_prefixes``, the predictor's values on the prefix
            samples (``depths > 0``, in sample order) *before* the update, else ``None``.
        stats: what ``predictor.update`` returned (``loss``, ``n``, ...).
        warning: the no-contrast warning (:func:`reward_warning`), or ``None``.
    """

    contexts: list[Any]
    targets: np.ndarray
    weights: np.ndarray
    tree_index: np.ndarray
    node_ids: np.ndarray
    depths: np.ndarray
    prefix_weight: float
    prefix_predictions: np.ndarray | None
    stats: dict[str, Any]
    warning: str | None



def predictor_samples(
    trees: Sequence[RolloutTree], context: Callable[[int, int], Any], *, estimator: str = "recursive",
    root_rollouts_only: bool = False,
) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray]:
    """The predictor's regression set from finished trees.

    Every non-terminal node with a target (the root, depth 0, and every visited prefix)
    gives one sample: ``context(tree index, node id)`` and its target from
    ``tree.targets(estimator, outcomes=True)`` (the recursive mean by default). With
    ``root_rollouts_only``, nodes inside continuations give none (their anchors' targets
    still average over them).

    Returns:
        ``(contexts, targets (n,), tree index (n,), node id (n,))``, trees in order and
        nodes by id within a tree.
    """
    contexts, targets, where = [], [], []
    for t, tree in enumerate(trees):
        for node_id, target in sorted(tree.targets(estimator, outcomes=True).items()):  # a success probability
            node = tree.nodes[node_id]
            if not node.terminal and not (root_rollouts_only and node.is_continuation):
                contexts.append(context(t, node_id))
                targets.append(target)
                where.append((t, node_id))
    index = np.asarray(where, dtype=np.int64).reshape(-1, 2)
    return contexts, np.asarray(targets, dtype=float), index[:, 0], index[:, 1]


def prefix_weight_for_share(n_prompt: int, n_prefix: int, share: float) -> float:
    """Weight of each prefix sample so that prefix samples hold ``share`` of a batch's
    total weight, prompt samples weighing 1 each (the paper's batches: about 6 % prefix)."""
    if not 0 <= share < 1:
        raise ValueError(f"prefix share must lie in [0, 1), got {share!r}")
    if n_prefix == 0 or n_prompt == 0:
        return 1.0
    return share / (1 - share) * n_prompt / n_prefix


def knob_hint(knobs: Mapping[str, str] | None) -> str:
    """The tail of a no-contrast message naming the env's own difficulty knobs
    (:class:`~trace_gym.env.contract.DifficultyKnobs`); ``""`` when it declares none."""
    if not knobs:
        return ""
    return "; this env's difficulty knobs: " + "; ".join(f"{name}: {text}" for name, text in knobs.items())


class NoContrast(str):
    """A no-contrast warning (:func:`reward_warning`): its text, with what it found (``head``)
    and what to change (``advice``: after ``"; make the tasks "``) kept apart, so a repeat can
    say the advice once (:func:`brief_repeats`) without reading the text back. It is a ``str``
    (the text whole) wherever warnings are printed or written to JSON."""

    head: str
    advice: str

    def __new__(cls, head: str, advice: str) -> NoContrast:
        line = super().__new__(cls, f"{head}; make the tasks {advice}")
        line.head, line.advice = head, advice
        return line

    def at(self, where: str) -> NoContrast:
        """The same warning said of ``where`` (``"step 3"``, ``"seed 0, trace"``): ``"where: text"``."""
        return NoContrast(f"{where}: {self.head}", self.advice)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:  # pickled and copied with its parts
        return NoContrast, (self.head, self.advice)


def reward_warning(trees: Sequence[RolloutTree], knobs: Mapping[str, str] | None = None) -> NoContrast | None:
    """A one-line warning when every finished leaf has the same outcome (all 0 or all 1):
    then no prompt is mixed and no strategy can find contrast; a group-relative update
    learns nothing. It ends with the env's own difficulty ``knobs`` (:func:`knob_hint`).
    ``None`` otherwise (or with no leaves)."""
    rewards = [leaf.reward for t in trees for leaf in t.leaves() if leaf.reward is not None]
    if not rewards:
        return None
    wins = sum(r >= SUCCESS_THRESHOLD for r in rewards)
    if 0 < wins < len(rewards):
        return None
    low, high = min(rewards), max(rewards)
    seen = f"reward {low:g}" if low == high else f"rewards {low:g} to {high:g}"
    outcome = (f"failed ({seen}, below the success threshold {SUCCESS_THRESHOLD:g})" if wins == 0
               else f"succeeded ({seen})")
    return NoContrast(f"every one of the {len(rewards)} rollouts {outcome}: no prompt is mixed, so there is no "
                      "contrast to find and a group-relative update learns nothing",
                      ("easier, the policy stronger or the turn/token limits larger" if wins == 0 else "harder")
                      + knob_hint(knobs))


def brief_repeats(warnings: Sequence[str]) -> list[str]:
    """``warnings`` with the advice of every repeated :class:`NoContrast` cut to "as above": the
    first one with a given advice keeps it whole, so a run whose every arm or step found no
    contrast says the advice once. Any other line is kept whole."""
    seen: set[str] = set()
    out = []
    for line in warnings:
        advice = getattr(line, "advice", None)
        if advice is not None and advice in seen:
            out.append(f"{line.head}; what to change: as above")
        else:
            if advice is not None:
                seen.add(advice)
            out.append(line)
    return out


def update_predictor(step: Any, predictor: SuccessPredictor, runner: Any, prefix_share: float,
                     score_prefixes: bool = False, root_rollouts_only: bool = False) -> Learning:
    """Step 4: regress the predictor on the step's trees (see the module docstring;
    ``root_rollouts_only``: :func:`predictor_samples`). ``step`` is the driver's
    :class:`~trace_gym.step.driver.StepResult`, ``runner`` its :class:`~trace_gym.step.driver.BranchRunner`
    (typed loosely: the driver imports this module, not the other way round)."""
    keys = step.tree_candidates.tolist()
    contexts, targets, tree_index, node_ids = predictor_samples(
        step.trees, lambda t, node: runner.node_context(keys[t], node), root_rollouts_only=root_rollouts_only)
    depths = np.array([step.trees[t].nodes[n].depth for t, n in zip(tree_index, node_ids)], dtype=np.int64)
    prefix = depths > 0
    weight = prefix_weight_for_share(int((~prefix).sum()), int(prefix.sum()), prefix_share)
    weights = np.where(prefix, weight, 1.0)
    scored = None
    if score_prefixes:  # before the update: what the predictor knew when it allocated
        chosen = [c for c, p in zip(contexts, prefix) if p]
        scored = np.asarray(predictor.predict(chosen), dtype=float) if chosen else np.zeros(0)
    with step.ledger.phase("predictor_update"):
        stats = predictor.update(contexts, targets, weights) if contexts else {}
        if isinstance(predictor, ObservesOutcomes) and step.trees:  # each prompt's own evidence
            outcomes = np.array([t.root_outcomes() for t in step.trees], dtype=float).reshape(-1, 2)
            predictor.observe_outcomes([runner.node_context(k, ROOT) for k in keys], outcomes[:, 0], outcomes[:, 1])
    return Learning(contexts, targets, weights, tree_index, node_ids, depths, weight, scored, dict(stats or {}),
                    reward_warning(step.trees, getattr(runner, "difficulty_knobs", None)))
