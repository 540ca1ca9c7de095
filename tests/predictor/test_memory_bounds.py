"""Memory that must not grow without end (issue 44, class G): per-prompt evidence pruned below
the weight that can still matter (predictions equal to the unpruned ones within the stated
tolerance), a replay buffer whose add is O(1) amortised (counted in executed lines, against a
planted quadratic variant), and the simulator's learned predictor's ``memory`` as documented."""

from __future__ import annotations

import math
import pickle
import re
import sys

import numpy as np
import pytest

from trace_gym.predictor import memory as predictor_memory
from trace_gym.predictor.memory import EVIDENCE_TOLERANCE, MIN_RECENCY, PromptEvidence, ReplayBuffer


# ---------------------------------------------------------------------- per-prompt evidence
def _feed(evidence: PromptEvidence, updates: int, new_per_update: int, trials: int, recurring: int, seed: int):
    """``updates`` updates, each observing ``new_per_update`` prompts never seen before and, every
    150 updates, the ``recurring`` prompts again (some pruned meanwhile, some not)."""
    rng = np.random.default_rng(seed)
    for u in range(updates):
        keys = [f"u{u}/p{i}" for i in range(new_per_update)]
        if u % 150 == 0:
            keys += [f"r{i}" for i in range(recurring)]
        n = np.full(len(keys), float(trials))
        evidence.observe(keys, rng.binomial(trials, rng.random(len(keys))).astype(float), n)
        evidence.tick()


@pytest.mark.parametrize("discount, strength, trials", [(0.9, 4.0, 8), (0.5, 1.0, 32), (0.99, 16.0, 4),
                                                        (0.95, 4.0, 64)])
def test_pruned_evidence_predicts_as_the_unpruned_within_the_tolerance(discount, strength, trials):
    pruned, kept = PromptEvidence(discount, strength), PromptEvidence(discount, strength, tolerance=0.0)
    updates, new = 1200, 20
    for evidence in (pruned, kept):
        _feed(evidence, updates, new, trials, recurring=30, seed=1)
    assert len(kept) == updates * new + 30  # the unpruned version keeps every prompt ever seen
    # the stated bound: an entry is kept while n * discount**age >= tolerance * strength, and pruning
    # waits until the entries have doubled: at most 2 x (horizon + 1) updates' prompts, plus the recurring
    horizon = math.log(EVIDENCE_TOLERANCE * strength / trials) / math.log(discount)
    assert len(pruned) <= 2 * (math.ceil(horizon) + 1) * new + 30 + predictor_memory.MIN_PRUNE_ENTRIES
    rng = np.random.default_rng(2)
    probe = [f"u{u}/p{i}" for u in range(updates) for i in range(0, new, 3)] + [f"r{i}" for i in range(30)]
    head = rng.random(len(probe))
    assert np.abs(pruned.blend(probe, head) - kept.blend(probe, head)).max() <= EVIDENCE_TOLERANCE
    s1, n1 = pruned.counts(probe)
    s0, n0 = kept.counts(probe)
    assert np.abs(n1 - n0).max() < EVIDENCE_TOLERANCE * strength and np.abs(s1 - s0).max() < EVIDENCE_TOLERANCE * strength
    twin = PromptEvidence()  # the state a checkpoint carries: the pruned entries only, and it round-trips
    twin.load_state_dict(pruned.state_dict())
    assert len(twin) == len(pruned) and np.array_equal(twin.blend(probe, head), pruned.blend(probe, head))


def test_the_issues_case_two_thousand_updates_of_a_hundred_new_prompts():
    evidence = PromptEvidence()  # the predictors' defaults: discount 0.9, strength 4
    _feed(evidence, 2000, 100, trials=8, recurring=0, seed=3)
    kept = len(evidence)
    size = len(pickle.dumps(evidence.state_dict()))
    assert kept < 30_000 and size < 3_000_000, (kept, size)  # was 200,000 entries, 11.6 MB
    evidence.prune()  # at most twice what still matters is held between prunings; after one, only that
    oldest = min(n * 0.9 ** (evidence._tick - t) for _, n, t in evidence._counts.values())
    assert oldest >= EVIDENCE_TOLERANCE * 4 and len(evidence) <= kept


def test_evidence_without_fading_or_tolerance_keeps_everything_and_a_bad_tolerance_is_one_line():
    for evidence in (PromptEvidence(discount=1.0), PromptEvidence(tolerance=0.0)):
        _feed(evidence, 300, 10, trials=8, recurring=0, seed=4)
        assert len(evidence) == 3000
    with pytest.raises(ValueError, match=r"evidence tolerance must lie in \[0, 1\), got -1"):
        PromptEvidence(tolerance=-1)
    old = PromptEvidence()  # a checkpoint written before pruning: loads, and is pruned at its next update
    _feed(old, 200, 10, trials=8, recurring=0, seed=5)
    state = old.state_dict()
    state.pop("tolerance"), state.pop("pruned_size")
    state["counts"].update({f"ancient{i}": (1.0, 2.0, -5000) for i in range(2000)})
    loaded = PromptEvidence()
    loaded.load_state_dict(state)
    loaded.tick()
    assert not any(str(k).startswith("ancient") for k in loaded._counts)


# ---------------------------------------------------------------------- the replay buffer
class QuadraticReplay(ReplayBuffer):
    """The planted variant: the add before issue 44 (a list of chunks rebuilt, and their sizes
    summed, at every add; the oldest chunk cut by slicing)."""

    def __post_init__(self):
        super().__post_init__()
        self._list: list = []

    def __len__(self):
        return sum(len(t) for _, t, _, _ in self._list)

    def add(self, items, targets, weights):
        targets, weights = np.asarray(targets, dtype=float), np.asarray(weights, dtype=float)
        self._tick += 1
        if len(targets):
            self._list.append((items, targets, weights, self._tick))
        horizon = math.inf if math.isinf(self.half_life) else self.half_life * math.log2(1 / MIN_RECENCY)
        self._list = [c for c in self._list if self._tick - c[3] <= horizon]
        over = len(self) - self.capacity
        while over > 0:
            items0, t0, w0, tick0 = self._list[0]
            if len(t0) <= over:
                self._list.pop(0)
                over -= len(t0)
            else:
                self._list[0] = (items0[over:], t0[over:], w0[over:], tick0)
                over = 0

    def _kept(self):
        return list(self._list)


def _lines_run(fn) -> int:
    """Lines executed in the memory module (and its classes here) while ``fn`` runs: the work an
    add does, counted (the loops and comprehensions of a Python add count once per element)."""
    files = {predictor_memory.__file__, __file__}
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename in files and frame.f_code.co_name != "_lines_run" else None

    sys.settrace(calls)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _single_adds(buffer: ReplayBuffer, n: int) -> None:
    one_w = np.ones(1)
    for i in range(n):
        buffer.add([i], np.array([i % 2], dtype=float), one_w)


@pytest.mark.parametrize("half_life, capacity", [(math.inf, 20_000), (1e6, 20_000), (math.inf, 100), (1e6, 100)])
def test_single_sample_adds_cost_the_same_whatever_the_buffer_holds(half_life, capacity):
    work = {}
    for cls in (ReplayBuffer, QuadraticReplay):
        for n in (300, 600):
            work[cls, n] = _lines_run(lambda: _single_adds(cls(half_life, capacity), n))
    per_add = work[ReplayBuffer, 600] / 600
    assert per_add < 40 and work[ReplayBuffer, 600] < 2.3 * work[ReplayBuffer, 300], work
    # the planted quadratic add: its work per add grows with what the buffer holds
    assert work[QuadraticReplay, 600] / 600 > 5 * per_add, work


def test_thirty_thousand_single_adds_complete_and_keep_what_the_old_add_kept():
    buffer = ReplayBuffer(half_life=math.inf, capacity=20_000)
    _single_adds(buffer, 30_000)
    items, y, w = buffer.samples()
    assert len(buffer) == 20_000 and items == list(range(10_000, 30_000)) and np.all(w == 1.0)
    rng = np.random.default_rng(0)
    for half_life, capacity in [(2.0, 50), (math.inf, 37), (8.0, 1000), (3.0, 5)]:
        new, old = ReplayBuffer(half_life, capacity), QuadraticReplay(half_life, capacity)
        start = 0
        for _ in range(400):  # batches of 0..40 samples: the oldest chunk is often cut part-way
            size = int(rng.integers(0, 41))
            items, t, wt = list(range(start, start + size)), rng.random(size), rng.random(size)
            start += size
            new.add(items, t, wt)
            old.add(items, t, wt)
            assert len(new) == len(old)
        for a, b in zip(new.samples(), old.samples()):
            assert np.array_equal(np.asarray(a), np.asarray(b))
        twin = ReplayBuffer()
        twin.load_state_dict(new.state_dict())
        assert len(twin) == len(new) and twin.samples()[0] == new.samples()[0]


# ---------------------------------------------------------------------- the simulator's learned predictor
def _sim_states(n: int, rng: np.random.Generator):
    from trace_gym.sim.simulator import SimState

    return [SimState(task=int(rng.integers(0, 20)), turn=int(rng.integers(0, 3)), value=0.5, signal=float(rng.normal()),
                     context_tokens=10) for _ in range(n)]


@pytest.mark.parametrize("memory, rows", [(0, 0), (1, 1), (50, 50), (10_000, 200)])
def test_the_learned_predictors_memory_is_what_the_docs_say(memory, rows):
    from trace_gym.predictor.kinds import make_predictor

    rng = np.random.default_rng(0)
    features = rng.normal(size=(20, 3))
    learned = make_predictor("learned", {"memory": memory}, features=features, seed=0)
    for _ in range(10):  # 10 updates of 20 examples
        states = _sim_states(20, rng)
        stats = learned.update(states, rng.random(20))
    assert stats["n"] == (20 if memory == 0 else min(memory, 200))  # what the last update fitted
    kept = learned.state_dict()["x"]
    assert (0 if kept is None else len(kept)) == rows


@pytest.mark.parametrize("bad", [-1, -50_000, 2.5, True, "10"])
def test_a_bad_memory_is_refused_in_one_line(bad):
    from trace_gym.predictor.kinds import make_predictor

    # a wrong type is refused by the kwargs' signature check, a negative count by the predictor
    said = (r"memory must be an integer >= 0 \(examples kept; 0: none\)" if isinstance(bad, int) and bad is not True
            else "predictor_kwargs: learned takes memory as int")
    with pytest.raises(ValueError, match=rf"{said}, got {re.escape(repr(bad))}"):
        make_predictor("learned", {"memory": bad}, features=np.zeros((2, 3)), seed=0)
