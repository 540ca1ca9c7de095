"""The official BFCL multi-turn rule, one turn at a time: the env's reward and the metric.

bfcl-eval's ``multi_turn_checker`` grades a finished conversation turn by turn and stops
at the first failing turn. For every turn whose ground truth has calls:

1. ``multi_turn:empty_turn_model_response``: the model made no (decodable) call in
   that turn;
2. ``multi_turn:instance_state_mismatch``: some involved instance differs from the
   ground-truth run's instance in a public attribute (``vars()`` minus ``_``-names);
3. ``multi_turn:execution_response_mismatch``: some result of the ground-truth calls of
   this turn is missing from *all* the model's results so far (a multiset check: each
   model result can match one ground-truth result).

Turns whose ground truth is empty (miss_param / miss_func turns where the model should
ask or has no function yet) are not checked, but their calls still change the state
the next checks see. A model that exceeds the step limit in any turn fails
(``multi_turn:force_terminated``). The entry passes when every turn passes.

Here the same checks run at the end of each user turn, against a cached ground-truth run
(:func:`ground_truth`), so the env can report the first failing turn as soon as it ends.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from trace_gym.types import Task

from environments.bfcl.executor import execute, make_instances, method_table
from environments.bfcl.parsing import parse_ground_truth_call

EMPTY_TURN = "multi_turn:empty_turn_model_response"
STATE_MISMATCH = "multi_turn:instance_state_mismatch"
RESPONSE_MISMATCH = "multi_turn:execution_response_mismatch"
FORCE_TERMINATED = "multi_turn:force_terminated"
CHECKS = (EMPTY_TURN, STATE_MISMATCH, RESPONSE_MISMATCH, FORCE_TERMINATED)


@dataclass(frozen=True)
class TurnTruth:
    """The ground-truth run after one user turn.

    Attributes:
        calls: the ground-truth call strings of this turn (may be empty).
        results: their execution results, in order.
        instances: the ground-truth backend instances after this turn (read-only).
    """

    calls: tuple[str, ...]
    results: tuple[str, ...]
    instances: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class TurnCheck:
    """The verdict for one user turn (``check`` names the failed check, if any)."""

    turn: int
    passed: bool
    check: str | None = None
    message: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"turn": self.turn, "passed": self.passed, "check": self.check, "message": self.message, "details": dict(self.details)}


def is_long_context(task: Task) -> bool:
    """bfcl-eval's rule: ``"long_context" in`` the id's category part."""
    category = task.metadata.get("category") or task.id.rsplit("_", 1)[0]
    return "long_context" in category


def new_instances(task: Task) -> dict[str, Any]:
    meta = task.metadata
    return make_instances(meta["initial_config"], meta["involved_classes"], is_long_context(task))


def run_ground_truth(task: Task) -> tuple[TurnTruth, ...]:
    """Execute the task's ground-truth calls turn by turn on fresh instances."""
    instances = new_instances(task)
    table = method_table(instances)
    truths = []
    for turn in task.answer:
        results = []
        for text in turn:
            name, args, kwargs = parse_ground_truth_call(text)
            results.append(execute(instances, table, name, args, kwargs))
        frozen = pickle.loads(pickle.dumps(instances, protocol=pickle.HIGHEST_PROTOCOL))
        truths.append(TurnTruth(tuple(turn), tuple(results), frozen))
    return tuple(truths)


@dataclass(frozen=True)
class Reference:
    """What an episode needs from its task, computed once per task.

    Attributes:
        truths: the ground-truth run, one :class:`TurnTruth` per user turn.
        initial: the freshly initialised instances, pickled (``pickle.loads`` is much
            faster than re-running ``_load_scenario`` on a deep copy of the config).
    """

    truths: tuple[TurnTruth, ...]
    initial: bytes = field(repr=False)

    def fresh_instances(self) -> dict[str, Any]:
        return pickle.loads(self.initial)


_CACHE: "OrderedDict[tuple[str, str], Reference]" = OrderedDict()
_CACHE_SIZE = 1024


def _digest(task: Task) -> str:
    meta = task.metadata
    blob = json.dumps([task.answer, meta["initial_config"], list(meta["involved_classes"]), meta.get("category")], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()


def reference_key(task: Task) -> tuple[str, str]:
    """The cache key of a task: its id and a digest of its content."""
    return (task.id, _digest(task))


def reference(task: Task, key: tuple[str, str] | None = None) -> Reference:
    """The task's :class:`Reference`, cached by :func:`reference_key` (a pure function of the task)."""
    key = key or reference_key(task)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    ref = Reference(run_ground_truth(task), pickle.dumps(new_instances(task), protocol=pickle.HIGHEST_PROTOCOL))
    _CACHE[key] = ref
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return ref


def ground_truth(task: Task) -> tuple[TurnTruth, ...]:
    """:func:`run_ground_truth`, cached."""
    return reference(task).truths


def state_differences(model_instances: Mapping[str, Any], truth_instances: Mapping[str, Any]) -> tuple[str | None, dict]:
    """The first class whose public attributes differ, and the differing attributes."""
    for class_name, truth in truth_instances.items():
        model = model_instances[class_name]
        if type(model) is not type(truth):
            raise TypeError(f"{class_name}: model instance is a {type(model).__name__}, truth a {type(truth).__name__}")
        diffs = {}
        for attr in vars(truth):
            if attr.startswith("_"):
                continue
            mine, theirs = getattr(model, attr), getattr(truth, attr)
            try:
                differs = bool(mine != theirs)
            except Exception as exc:  # e.g. RecursionError comparing a cyclic model-made tree: not equal
                differs, mine = True, f"<could not be compared: {type(exc).__name__}>"
            if differs:
                diffs[attr] = {"model": mine, "ground_truth": theirs}
        if diffs:
            return class_name, diffs
    return None, {}


def missing_results(model_results: Sequence[str], truth_results: Sequence[str]) -> list[str]:
    """Ground-truth results not found among the model's (each model result used once)."""
    pool = list(model_results)
    missing = []
    for item in truth_results:
        try:
            pool.remove(item)
        except ValueError:
            missing.append(item)
    return missing


def check_turn(turn: int, truth: TurnTruth, had_calls: bool, instances: Mapping[str, Any], results_so_far: Sequence[str]) -> TurnCheck:
    """The official per-turn check (see the module docstring)."""
    if not truth.calls:
        return TurnCheck(turn, True, None, "no calls expected in this turn")
    if not had_calls:
        return TurnCheck(turn, False, EMPTY_TURN, f"Model response list is empty for turn {turn}")
    class_name, diffs = state_differences(instances, truth.instances)
    if class_name is not None:
        return TurnCheck(
            turn, False, STATE_MISMATCH,
            f"Model instance for {class_name} does not match the state with ground truth instance.",
            {"class": class_name, "attributes": sorted(diffs)},
        )
    missing = missing_results(results_so_far, truth.results)
    if missing:
        return TurnCheck(
            turn, False, RESPONSE_MISMATCH,
            f"Model response execution results so far does not contain all the ground truth response execution results for turn {turn}.",
            {"missing_items": [m[:500] for m in missing]},
        )
    return TurnCheck(turn, True, None, "state and results match the ground truth")
