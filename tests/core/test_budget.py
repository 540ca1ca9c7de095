"""BudgetLedger: nominal trajectory-equivalents and exact units."""

from __future__ import annotations

import pytest

from trace_gym.budget import CONTINUATION_COST, BudgetLedger, nominal_cost


def test_nominal_cost_of_the_paper_shapes():
    assert CONTINUATION_COST == 0.5
    assert nominal_cost(512, 2) == 1024  # HotpotQA (512, 2)
    assert nominal_cost(512, 6) == 2048  # (512, 6)
    assert nominal_cost(1024, 2) == 2048  # (1024, 2)
    assert nominal_cost(10) == 10
    with pytest.raises(ValueError, match="-1"):
        nominal_cost(-1, 2)


def test_ledger_counts_m_roots_with_n_continuations_each():
    led = BudgetLedger()
    m, n = 12, 3
    led.add_rollouts(m)
    for _ in range(m * n):
        led.add_continuations()
    assert led.nominal == m * (1 + n / 2) == nominal_cost(m, n)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phase_context_manager_adds_seconds_even_on_error():
    clock = FakeClock()
    led = BudgetLedger(clock=clock)
    with led.phase("generation"):
        clock.t += 2.5
        with led.phase("environment"):
            clock.t += 0.5
    with pytest.raises(RuntimeError):
        with led.phase("generation"):
            clock.t += 1.0
            raise RuntimeError("boom")
    assert led.seconds == {"generation": 4.0, "environment": 0.5}
    assert led.total_seconds == 4.5


def test_merge_sums_and_leaves_inputs_alone():
    a = BudgetLedger(rollouts=2, continuations=4, generated_tokens=10, prefill_tokens=5, env_steps=7, seconds={"g": 1.0})
    b = BudgetLedger(rollouts=1, generated_tokens=3, env_steps=1, seconds={"g": 0.5, "e": 2.0})
    c = a.merge(b)
    assert (c.rollouts, c.continuations, c.generated_tokens, c.prefill_tokens, c.env_steps) == (3, 4, 13, 5, 8)
    assert c.seconds == {"g": 1.5, "e": 2.0}
    assert c.nominal == 3 + 4 / 2
    assert a.rollouts == 2 and a.seconds == {"g": 1.0}
    assert (a + b).to_dict() == c.to_dict()


def test_include_adds_in_place_including_errors_and_unspent_units():
    a = BudgetLedger(rollouts=2, seconds={"g": 1.0})
    a.add_errors(1)
    b = BudgetLedger(continuations=3, seconds={"g": 0.5})
    b.add_errors(2)
    b.add_unspent_continuations(1)
    a.include(b)
    assert (a.rollouts, a.continuations, a.errors, a.unspent_continuations) == (2, 3, 3, 1)
    assert a.seconds == {"g": 1.5} and b.errors == 2
    assert a.nominal == 2 + 3 / 2  # unspent units cost nothing; the ledger shows them
    with pytest.raises(ValueError, match="errors must be >= 0, got -1"):
        a.add_errors(-1)


def test_exhausted_branches_are_counted_and_merged():
    a, b = BudgetLedger(), BudgetLedger()
    a.add_exhausted(2)
    b.add_exhausted()
    assert a.merge(b).exhausted == 3 and (a + b).to_dict()["exhausted"] == 3
    a.include(b)
    assert a.exhausted == 3 and a.nominal == 0  # a refused branch adds nothing by itself
    with pytest.raises(ValueError, match="exhausted must be >= 0, got -1"):
        a.add_exhausted(-1)


def test_to_dict_and_validation():
    led = BudgetLedger()
    led.add_rollouts(2)
    led.add_continuations(3)
    led.add_tokens(generated=100, prefill=40)
    led.add_env_steps(7)
    led.add_replayed_env_steps(2)  # a restore re-ran 2 steps: env steps, and counted apart
    led.add_seconds("allocation", 0.25)
    assert (led.env_steps, led.replayed_env_steps) == (9, 2)
    assert led.to_dict() == {
        "nominal": 3.5,
        "rollouts": 2,
        "continuations": 3,
        "generated_tokens": 100,
        "prefill_tokens": 40,
        "env_steps": 9,
        "replayed_env_steps": 2,
        "errors": 0,
        "unspent_continuations": 0,
        "recovered_episodes": 0,
        "redone_env_steps": 0,
        "reissued_completions": 0,
        "exhausted": 0,
        "seconds": {"allocation": 0.25},
    }
    with pytest.raises(ValueError, match="env steps must be >= 0, got -1"):
        led.add_env_steps(-1)
    with pytest.raises(ValueError, match="prefill tokens"):
        led.add_tokens(prefill=-3)
