"""`trace-gym bench`: one bench for simulated and real rollouts, checks that can fail,
exact costs beside nominal ones, the token-budget mode, and the CLI around it."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from trace_gym import cli
from trace_gym.bench import loop as bench
from trace_gym.bench.checks import Check, bench_checks, verdict
from trace_gym.bench.report import format_bench, results_json
from trace_gym.commands.bench import mode_config, mode_configs
from trace_gym.bench.env import run_env_bench
from trace_gym.bench.sim import run_sim_bench
from trace_gym.step.learning import prefix_weight_for_share
from trace_gym.predictor.kinds import make_predictor, predictor_spec
from trace_gym.bench.config import EnvBenchConfig, SimBenchConfig
from trace_gym.allocation.waves import is_wave_strategy
from trace_gym.strategies import STRATEGIES, shaped_strategies

SMALL = dict(seeds=2, steps=3, warmup_steps=1, pool_size=1024, candidates=128, root_budget=128)
SMALL_FLAGS = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]


def strategies_for(cfg, names=()):
    return shaped_strategies(names or cfg.strategies, group_size=cfg.group_size,
                             continuations_per_root=cfg.continuations_per_root)


def run_sim(**kw):
    cfg = SimBenchConfig(**{**SMALL, **kw})
    return run_sim_bench(cfg, strategies_for(cfg))


@pytest.fixture(scope="module")
def results():
    # every strategy (and the oracle row) once, shared by the tests that read a whole bench; one
    # warm-up and one measured step per seed is all they read (the full SMALL runs cost twice as much)
    return run_sim(steps=2)


def test_headline_is_the_learned_predictor_and_the_oracle_is_a_labelled_upper_bound(results):
    s = results["strategies"]
    headline = [n for n, v in s.items() if not v["upper_bound"]]
    assert set(headline) == set(STRATEGIES)
    # one-shot strategies are driven by the bench's predictor; a wave strategy that names its own kind by its own
    own = {n: getattr(STRATEGIES[n], "predictor", None) for n in headline}
    assert all(s[n]["predictor"] == (own[n] or "learned") for n in headline)
    assert any(own.values()) and not all(own.values())
    oracle = "trace" + bench.UPPER_BOUND
    assert s[oracle]["upper_bound"] and s[oracle]["predictor"] == "oracle"
    assert s[oracle]["prompt_spearman"] == pytest.approx(1.0)
    assert 0 < s["trace"]["prompt_spearman"] < 1  # learned: informative, not perfect
    printed = format_bench(results)
    assert "(oracle, upper bound)" in printed and "Headline predictor: learned" in printed
    assert "Continuations by prefix depth" in printed
    # the checks read only headline rows
    assert all("oracle" not in c.detail for c in results["checks"])


def test_equal_nominal_budget_and_exact_units(results):
    budget = SMALL["root_budget"] * 2  # M (1 + N/2) with N = 2
    assert results["nominal_budget"] == budget
    s = results["strategies"]
    for name, entry in s.items():
        # a one-shot strategy spends the whole budget; a wave strategy's own rule may stop below it, never above
        spends_all = not is_wave_strategy(STRATEGIES.get(name.split(" ")[0]))
        assert entry["nominal_cost"] == budget if spends_all else 0 < entry["nominal_cost"] <= budget, name
        assert entry["env_steps"] > 0 and entry["generated_tokens"] > 0 and entry["prefill_tokens"] > 0
        assert len(entry["per_rep"]) == SMALL["seeds"]
        for row in entry["per_rep"]:  # ratios recomputed from the per-step totals
            assert row["pairs_per_1k_tokens"] == pytest.approx(1e3 * row["contrast_pairs"] / row["generated_tokens"])
            assert row["pairs_per_env_step"] == pytest.approx(row["contrast_pairs"] / row["env_steps"])
    assert (s["uniform"]["rollouts"], s["uniform"]["continuations"]) == (budget, 0)
    assert s["uniform"]["distinct_prompts"] == budget / 8
    assert set(s["uniform"]["contrast_pairs_by_depth"]) == {"0"}  # flat: pairs only at the root
    assert any(int(d) > 0 for d in s["trace"]["contrast_pairs_by_depth"])
    assert "1" in s["trace"]["per_rep"][0]["prefix_spearman_by_depth"]
    spent = s["trace"]["continuations_by_depth"]  # per step: every continuation TRACE bought, by its prefix's depth
    assert sum(spent.values()) == pytest.approx(s["trace"]["continuations"])
    assert all(0 <= s["trace"]["continuation_wins_by_depth"].get(d, 0.0) <= n for d, n in spent.items())
    assert not s["uniform"]["continuations_by_depth"]


def test_confidence_intervals_only_with_repetitions(results):
    s = results["strategies"]["trace"]
    mean, half, n = __import__("trace_gym.report", fromlist=["mean_ci"]).mean_ci(
        [r["effective_ratio"] for r in s["per_rep"]])
    assert (s["effective_ratio"], s["effective_ratio_ci"]) == pytest.approx((mean, half)) and n == 2
    assert "±" in format_bench(results)
    one = run_sim(seeds=1, steps=2, strategies=("uniform", "trace"))
    assert math.isnan(one["strategies"]["trace"]["effective_ratio_ci"])
    printed = format_bench(one)
    assert "±" not in printed.split("### Checks")[0] and "no confidence interval" in printed
    assert "one repetition: no interval" in printed


class ShuffledValues:
    """A broken TRACE root allocator: solves the right problem on the wrong prompts."""

    def __init__(self, inner):
        self.inner = inner

    def allocate(self, values, budget, rng):
        return self.inner.allocate(rng.permutation(np.asarray(values)), budget, rng)


def test_a_planted_broken_trace_fails_a_check():
    # the default scale (256 candidates, M = 256), 3 seeds: large enough that the
    # learned-predictor TRACE is distinguishable from uniform (see docs/benchmarking.md)
    # (3 steps, 2 of them measured: TRACE's lead over uniform is as clear as with 4, +15.0 [+6.0, +24.0]
    # prompts/step; at half the scale the shuffled TRACE would still pass, so the scale stays)
    cfg = SimBenchConfig(seeds=3, steps=3, strategies=("uniform", "trace"), oracle_upper_bound=False)
    table = strategies_for(cfg)
    good = run_sim_bench(cfg, table)
    table["trace"] = dataclasses.replace(table["trace"], root_allocator=ShuffledValues(table["trace"].root_allocator))
    broken = run_sim_bench(cfg, table)
    name = "trace mixed prompts/step above uniform"  # shuffled, TRACE spreads 2-3 rollouts over random prompts
    assert {c.name: c.status for c in good["checks"]}[name] == "PASS"
    assert {c.name: c.status for c in broken["checks"]}[name] in ("FAIL", "NOT SHOWN")
    assert broken["strategies"]["trace"]["effective_ratio"] < good["strategies"]["trace"]["effective_ratio"]


def test_checks_fail_and_skip_when_they_should():
    fake = _fake([0.36, 0.35, 0.345], [0.3, 0.31, 0.29])
    fake["strategies"]["trace"]["nominal_cost"] = 9.0
    status = {c.name: c.status for c in bench_checks(fake)}
    assert status["trace effective ratio above uniform"] == "PASS"
    assert status["trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)"] == "FAIL"
    assert "trace effective ratio above pcl" not in status  # no pcl row: no check about it
    assert status["equal nominal budget"] == "FAIL"


def test_a_check_never_passes_on_an_interval_that_straddles_zero():
    # trace ahead in the mean, but the paired differences disagree in sign: NOT SHOWN, never PASS
    straddle = _fake([0.6, 0.2, 0.5, 0.3], [0.3, 0.4, 0.35, 0.4])
    checks = {c.name: c for c in bench_checks(straddle)}
    above = checks["trace effective ratio above uniform"]
    assert straddle["strategies"]["trace"]["effective_ratio"] > straddle["strategies"]["uniform"]["effective_ratio"]
    assert above.status == "NOT SHOWN" and "[-" in above.detail
    assert not any(c.status == "PASS" for n, c in checks.items() if n not in COST_CHECKS)
    assert verdict(straddle).startswith("trace and uniform cannot be told apart")


def test_interval_of_a_ratio_stays_inside_what_a_ratio_can_be():
    from trace_gym.bench.checks import METRICS, paired

    # two repetitions far apart: the t interval of the mean (± 6.4) reaches far past [0, 1]
    wide = _fake([1.0, 0.0], [0.5, 0.5])
    row = wide["strategies"]["trace"]
    from trace_gym import report

    mean, half, _ = report.mean_ci([r["effective_ratio"] for r in row["per_rep"]])
    assert mean - half < 0 and mean + half > 1  # the raw t interval leaves [0, 1] ...
    printed = report.pm(mean, half, n=2, low=0.0, high=1.0)
    assert printed == "0.500 [0.000, 1.000]"  # ... the printed one does not
    diff = paired(wide["strategies"], "trace", "uniform", METRICS["effective_ratio"])
    assert -1.0 <= diff["low"] <= diff["high"] <= 1.0 and diff["shown"] == 0


#: One strategy of each kind for the token-budget mode in the default run: the reference, a tree
#: strategy that pays for its continuations with fewer roots, a wave strategy, and ar3po, whose
#: budget is scaled far above 1 (the rescaling loop runs several tries); the full table is behind -m slow.
TOKEN_MODE_SUBSET = ("uniform", "trace_prefix_only", "dapo", "ar3po")


def assert_tokens_equalised(res):
    reference = res["strategies"]["uniform"]["generated_tokens"]
    for name, v in res["strategies"].items():
        assert abs(v["generated_tokens"] / reference - 1) <= 0.02, name
    check = next(c for c in res["checks"] if c.name.startswith("equal generated tokens"))
    assert check.status == "PASS"
    # the tree strategies pay for their continuations with a smaller nominal budget
    scales = {n: v["budget_scale"] for n, v in res["strategies"].items()}
    assert scales["uniform"] == 1.0 and scales["trace_prefix_only"] < 1.0
    assert "exact generated tokens" in format_bench(res)


def test_token_budget_mode_equalises_generated_tokens():
    res = run_sim(seeds=1, steps=2, budget_unit="tokens", strategies=TOKEN_MODE_SUBSET, oracle_upper_bound=False)
    assert set(res["strategies"]) == set(TOKEN_MODE_SUBSET)
    assert_tokens_equalised(res)
    assert res["strategies"]["ar3po"]["budget_scale"] > 1.2  # scaled well away from the nominal budget


@pytest.mark.slow  # ~35 s idle; test_token_budget_mode_equalises_generated_tokens covers one strategy of each kind
def test_token_budget_mode_equalises_generated_tokens_for_every_strategy():
    res = run_sim(seeds=1, steps=3, budget_unit="tokens")
    assert set(res["strategies"]) == set(STRATEGIES) | {"trace" + bench.UPPER_BOUND}
    assert_tokens_equalised(res)


def test_prefix_weight_for_share_hand_values():
    # 10 prompts, 90 prefixes, 6 % share: w * 90 / (10 + w * 90) = 0.06
    w = prefix_weight_for_share(10, 90, 0.06)
    assert w * 90 / (10 + w * 90) == pytest.approx(0.06)
    assert prefix_weight_for_share(10, 0, 0.06) == 1.0
    with pytest.raises(ValueError, match="1.5"):
        prefix_weight_for_share(1, 1, 1.5)


def test_root_allocation_demo_follows_the_method_page(results):
    demo = results["root_allocation_demo"]
    alloc = dict(zip(demo["budgets"], demo["allocations"]))
    assert all(sum(m) == b for b, m in alloc.items())
    assert alloc[4] == [0, 0, 2, 2, 0, 0]  # tight budget: only the 0.5 prompts
    assert all(m[0] == 0 for m in alloc.values())  # 0.99 never worth it in this range
    assert alloc[64][2] <= 7 and alloc[64][1] > alloc[64][2]  # 0.5s saturate; 0.9 takes more
    assert alloc[32][5] == 0 and alloc[64][5] > 0  # 0.02 only near the top of the range


# ---------------------------------------------------------------------- CLI
def test_cli_bench_writes_json_and_plots(tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    rc = cli.main(["bench", "--sim", *SMALL_FLAGS, "--seeds=1", "--steps=2", "--strategies=uniform,trace",
                   "--json", str(out_json), "--out", str(tmp_path / "plots")])
    printed = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert set(data["strategies"]) == {"uniform", "trace", "trace" + bench.UPPER_BOUND}
    assert data["strategies"]["trace"]["nominal_cost"] == 256.0
    assert "| trace " in printed and "trace effective ratio above uniform" in printed
    assert "Paired differences" in printed and "| trace - uniform" in printed
    assert "pairs/1k tok" in printed and "Root allocation demo" in printed
    for name in ("effective_ratio.png", "contrast_pairs_by_depth.png", "root_allocation.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert rc == 0


def test_flags_are_typed_per_mode_and_refused_in_the_wrong_mode(capsys):
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    assert "256 with --sim, 8 with --env" in " ".join(help_text.split())  # each mode's own default
    assert cli.main(["bench", "--sim", "--warmup-budget", "4"]) == 2
    assert "--warmup-budget does not apply to --sim (only to --env)" in capsys.readouterr().err
    assert cli.main(["bench", "--env", "math_python", "--feature-spearman", "0.5"]) == 2
    assert "does not apply to --env" in capsys.readouterr().err
    assert cli.main(["bench", "--sim", "--seeds", "two"]) == 2
    assert "seeds: expected an int, got 'two'" in capsys.readouterr().err
    assert cli.main(["bench"]) == 2
    assert "--sim" in capsys.readouterr().err


def test_config_from_yaml_and_flags(tmp_path):
    path = tmp_path / "bench.yaml"
    path.write_text("seeds: 4\nroot_budget: 64\nstrategies: [uniform, pcl]\n")
    args = cli.build_parser().parse_args(["bench", "--sim", "--config", str(path), "--root-budget", "32"])
    cfg = mode_config(args, "sim", mode_configs())
    assert (cfg.seeds, cfg.root_budget, cfg.strategies) == (4, 32, ("uniform", "pcl"))
    assert cfg.nominal_budget == 64
    path.write_text("sedes: 4\n")
    with pytest.raises(ValueError, match="unknown key\\(s\\) \\['sedes'\\]"):
        mode_config(cli.build_parser().parse_args(["bench", "--config", str(path)]), "sim",
                        mode_configs())
    path.write_text("root_budget: [1, 2]\n")
    with pytest.raises(ValueError, match="root_budget: expected an int"):
        mode_config(cli.build_parser().parse_args(["bench", "--config", str(path)]), "sim",
                        mode_configs())
    with pytest.raises(ValueError, match="warmup_steps"):
        SimBenchConfig(steps=2, warmup_steps=2)
    with pytest.raises(ValueError, match="unknown strategies \\['nope'\\]"):
        strategies_for(SimBenchConfig(), ("nope",))


def test_shipped_yaml_matches_the_defaults():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "bench_sim.yaml"
    args = cli.build_parser().parse_args(["bench", "--sim", "--config", str(path)])
    assert mode_config(args, "sim", mode_configs()) == SimBenchConfig()


def test_adding_a_strategy_is_one_entry(monkeypatch):
    from baselines import UniformRootAllocator
    from trace_gym import strategies
    from trace_gym.allocation.allocators import TracePrefixAllocator
    from trace_gym.allocation.strategy import Strategy

    entry = Strategy(UniformRootAllocator(4), TracePrefixAllocator(), 2, description="mine")
    monkeypatch.setitem(strategies.STRATEGIES, "my_tree", entry)
    res = run_sim(seeds=1, steps=2, strategies=("my_tree",))
    assert res["strategies"]["my_tree"]["nominal_cost"] == 256
    assert res["strategies"]["my_tree"]["description"] == "mine"


def test_noisy_predictor_mode_runs():
    res = run_sim(seeds=1, steps=2, predictor="noisy", noisy_spearman=0.7, strategies=("pcl", "trace"))
    assert 0.4 < res["strategies"]["trace"]["prompt_spearman"] < 0.95


def test_envs_and_strategies_listings(capsys):
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "trace_gym/GuessNumber-v0" in out.split() and "math_python" in out
    assert cli.main(["strategies"]) == 0
    assert "random_tree" in capsys.readouterr().out


# ---------------------------------------------------------------------- real rollouts
def test_env_bench_on_a_tiny_model_reports_through_the_same_path(tiny_engine):
    from trace_gym.registry import env_family

    cfg = EnvBenchConfig(env="guess_number", candidates=4, root_budget=2, continuations_per_root=2, group_size=2,
                         warmup_budget=0, max_turns=2, max_turn_tokens=8, max_episode_tokens=512,
                         predictor="constant", strategies=("uniform", "trace"))
    res = run_env_bench(cfg, strategies_for(cfg), env_family("guess_number"), engine=tiny_engine)
    s = res["strategies"]
    assert set(s) == {"uniform", "trace"}
    for entry in s.values():
        assert entry["nominal_cost"] == cfg.nominal_budget == 4
        assert entry["generated_tokens"] > 0 and entry["env_steps"] > 0
        assert math.isnan(entry["effective_ratio_ci"])  # one repetition
    printed = format_bench(res)
    assert "Allocation benchmark on real rollouts: guess_number" in printed and "gen s" in printed
    assert any(c.name == "equal nominal budget" and c.status == "PASS" for c in res["checks"])


def test_env_bench_takes_the_lm_critic(tiny_engine, tiny_model_path, monkeypatch):
    import torch

    from trace_gym.predictor.critic import LMCriticPredictor
    from trace_gym.predictor.kinds import Context
    from trace_gym.registry import env_family

    assert isinstance(make_predictor("lm_critic", model_path=str(tiny_model_path)), LMCriticPredictor)
    with pytest.raises(ValueError, match="unknown predictor 'orakel'"):
        make_predictor("orakel")
    with pytest.raises(ValueError, match="predictor must be one of embedding, lm_critic, constant, beta_posterior, "
                                         "running_rate, got 'oracle'"):  # the zoo's kinds: the face registers them
        EnvBenchConfig(predictor="oracle")  # a simulator predictor cannot read real rollouts
    # predictor_kwargs reach the constructor (the configs' route to a GPU critic), and a
    # keyword the kind does not take is named with what it does take
    critic = make_predictor("lm_critic", {"max_length": 64, "dtype": "bfloat16"}, model_path=str(tiny_model_path))
    assert critic.max_length == 64 and next(critic.backbone.parameters()).dtype == torch.bfloat16
    assert critic.predict([Context("q")]).shape == (1,)
    assert make_predictor("constant", {"value": 0.25}).value == 0.25
    with pytest.raises(ValueError, match=r"lm_critic does not take 'devise'.*device"):
        make_predictor("lm_critic", {"devise": "cuda"}, model_path=str(tiny_model_path))
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, got 'bf16'"):
        predictor_spec("lm_critic", {"dtype": "bf16"}, model_path=str(tiny_model_path))  # caught before any load
    with pytest.raises(ValueError, match="'seed' comes from the config's seed"):
        predictor_spec("embedding", {"seed": 2}, seed=1)
    with pytest.raises(ValueError, match="needs model_path"):
        predictor_spec("lm_critic", model_path="None")
    cfg = EnvBenchConfig(env="guess_number", candidates=3, root_budget=2, continuations_per_root=0, group_size=2,
                         warmup_budget=0, max_turns=1, max_turn_tokens=4, max_episode_tokens=512,
                         predictor="lm_critic", strategies=("pcl",))
    # the critic reads the policy's own weights: here the tiny engine's model
    monkeypatch.setattr("trace_gym.models.resolve_model", lambda name: tiny_model_path)
    res = run_env_bench(cfg, strategies_for(cfg), env_family("guess_number"), engine=tiny_engine)
    assert res["strategies"]["pcl"]["predictor"] == "lm_critic"
    assert res["strategies"]["pcl"]["nominal_cost"] == 2


def _fake(eff_trace, eff_uniform):
    """Bench results with two arms whose every headline metric is the given per-repetition value."""
    def row(effs):
        keys = ("effective_ratio", "mixed_prompts", "mixed_per_1k_tokens")
        return {**{k: float(np.mean(effs)) for k in keys}, "nominal_cost": 10.0, "upper_bound": False,
                "predictor": "learned", "generated_tokens": 1.0, "per_rep": [{k: e for k in keys} for e in effs]}

    return {"nominal_budget": 10.0, "config": {"budget_unit": "nominal"}, "mode": "sim",
            "strategies": {"uniform": row(eff_uniform), "trace": row(eff_trace)}}


def test_the_verdict_says_which_way_it_goes_or_that_there_is_none():
    better = verdict(_fake([0.5, 0.52, 0.55], [0.3, 0.31, 0.29]))
    assert better.startswith("trace beats uniform on both headline metrics") and "3 paired repetitions" in better
    worse = verdict(_fake([0.2, 0.22, 0.19], [0.3, 0.31, 0.29]))
    assert worse.startswith("trace is WORSE than uniform")
    unclear = verdict(_fake([0.3, 0.5, 0.1], [0.3, 0.31, 0.29]))
    assert unclear.startswith("trace and uniform cannot be told apart")
    assert "one repetition" in verdict(_fake([0.5], [0.3]))
    # degenerate inputs: every rollout agreed, so nothing can be compared: SKIP, never PASS
    flat = _fake([0.0, 0.0], [0.0, 0.0])
    assert verdict(flat).startswith("NO VERDICT: no contrast")
    statuses = {c.name: c.status for c in bench_checks(flat)}
    assert statuses["trace effective ratio above uniform"] == "SKIP"
    assert statuses["trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)"] == "SKIP"


COST_CHECKS = {"equal nominal budget", "equal generated tokens (every strategy within 2 % of uniform's)"}


def assert_no_outcome_check_passes(results):
    """On a bench where every reward was equal, only the cost checks may PASS: every
    comparison of outcomes must say SKIP (no contrast), and the verdict that there is none."""
    printed = format_bench(results)
    passed = [c.name for c in results["checks"] if c.status == "PASS" and c.name not in COST_CHECKS]
    assert not passed, f"checks PASSed on a bench without contrast: {passed}"
    assert all(f"PASS: {c.name}" not in printed for c in results["checks"] if c.name not in COST_CHECKS)
    assert results["verdict"].startswith("NO VERDICT: no contrast")


@pytest.fixture(scope="module")
def all_fail():
    """The simulator bench in a world where every task is hopeless (success probability 0):
    every reward of every rollout is 0."""
    from trace_gym.sim import simulator as sim

    original = sim.make_pool
    sim.make_pool = lambda *a, **kw: dataclasses.replace(
        original(*a, **kw), success=np.zeros_like(original(*a, **kw).success))
    try:
        # every strategy, at a quarter of SMALL's budget and candidates: with no contrast anywhere,
        # the scale changes no check (each still SKIPs), only the cost
        return run_sim(seeds=2, steps=2, pool_size=256, candidates=32, root_budget=32)
    finally:
        sim.make_pool = original  # at once: a later test of this module runs in the real world


def test_an_all_zero_reward_bench_skips_every_comparison(all_fail):
    assert all(v["effective_ratio"] == 0 for v in all_fail["strategies"].values())
    status = {c.name: c.status for c in all_fail["checks"]}
    outcome_checks = {n for n in status if n not in COST_CHECKS}
    assert len(outcome_checks) >= 10 and all(status[n] == "SKIP" for n in outcome_checks)
    assert status["equal nominal budget"] == "PASS"  # costs, not outcomes: still checked
    printed = format_bench(all_fail)
    assert "SKIP: trace effective ratio >= 2x uniform" in printed and "no contrast" in printed
    assert "0.000 ± 0 (all 2 equal)" in printed  # not "0.000 ± 0.000"
    assert all(e["effective_ratio"] is None for e in all_fail["paired"])  # no paired difference of nothing
    assert_no_outcome_check_passes(all_fail)


def test_a_check_without_the_contrast_guard_would_pass_and_the_test_sees_it(all_fail, monkeypatch):
    from trace_gym.bench import checks as checks_module

    # the checks computed without the no-contrast guard (the bug of issue 20): 0 vs 0 "at least"
    # would be judged; with equal zeros the sign test shows nothing, so plant a guard that lets
    # a "2x" of nothing through and an interval that always excludes zero
    monkeypatch.setattr(checks_module, "no_contrast", lambda rows: False)
    monkeypatch.setattr(checks_module, "paired", lambda rows, a, b, metric, scale=1.0: {
        "a": a, "b": b, "metric": metric.key, "scale": scale, "mean_a": 0.0, "mean_b": 0.0, "difference": 0.0,
        "low": 0.0, "high": 0.0, "n": 2, "shown": 1, "note": ""})
    broken = dict(all_fail) | {"checks": checks_module.bench_checks(all_fail)}
    status = {c.name: c.status for c in broken["checks"]}
    assert status["trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)"] == "PASS"
    with pytest.raises(AssertionError, match="checks PASSed on a bench without contrast"):
        assert_no_outcome_check_passes(broken)


def test_a_comparison_skips_when_its_own_rows_have_no_contrast():
    fake = _fake([0.0] * 6, [0.0] * 6)
    fake["strategies"]["pcl"] = _fake([0.4] * 6, [0.0] * 6)["strategies"]["trace"]
    status = {c.name: c for c in bench_checks(fake)}
    # pcl found contrast, trace and uniform none: 0 vs 0 is still nothing to compare
    assert status["trace effective ratio above uniform"].status == "SKIP"
    assert status["trace effective ratio above pcl"].status == "FAIL"  # 0 vs 0.4 six times: a real loss
    # a ratio to a row without contrast is undefined, whatever the numerator
    fake = _fake([0.3, 0.4], [0.0, float("nan")])
    ratio = {c.name: c for c in bench_checks(fake)}[
        "trace effective ratio >= 2x uniform (paper, learned predictor: 60.6 / 26.8 = 2.26x)"]
    assert ratio.status == "SKIP" and "ratio to it is undefined" in ratio.detail
    fake = _fake([0.3, 0.4, 0.35, 0.3, 0.45, 0.4], [0.0] * 6)  # trace found contrast where uniform found none
    assert {c.name: c.status for c in bench_checks(fake)}["trace effective ratio above uniform"] == "PASS"


def test_equal_paired_differences_are_judged_by_the_sign_test():
    same = _fake([0.5, 0.6, 0.7], [0.3, 0.4, 0.5])  # +0.2 in every repetition (up to rounding)
    line = verdict(same)
    # no spread, so no t interval; the sign test of 3 agreeing signs: p = 2 / 2^3 = 0.25
    assert line.startswith("trace and uniform cannot be told apart") and "all differences equal" in line
    assert "± 0.000" not in line
    check = {c.name: c for c in bench_checks(same)}["trace effective ratio above uniform"]
    assert check.status == "NOT SHOWN"
    assert "+0.200 (all differences equal: no spread, judged by the exact sign test, 3 paired repetitions)" \
        in check.detail
    # six agreeing signs: p = 2 / 2^6 = 0.031 < 0.05
    six = _fake([0.5] * 6, [0.3] * 6)
    assert verdict(six).startswith("trace beats uniform")


def test_the_simulator_calibrated_to_a_bank_uses_the_banks_numbers(tmp_path):
    from bank_fixtures import write_synthetic_bank

    rng = np.random.default_rng(0)
    successes = rng.binomial(8, rng.beta(0.5, 1.5, size=64))
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", successes, roots=8, continuations=4, turns=3)
    cfg = SimBenchConfig(**{**SMALL, "seeds": 1, "steps": 2, "candidates": 24, "root_budget": 16,
                            "calibrate_from": str(path)}, strategies=("uniform", "trace"))
    res = run_sim_bench(cfg, strategies_for(cfg))
    values = res["calibration"]["values"]
    assert values["mean_success"] == pytest.approx(successes.mean() / 8, abs=1e-9)
    assert (values["min_turns"], values["max_turns"]) == (3, 3)
    assert res["config"]["mean_success"] == values["mean_success"] and res["config"]["max_turns"] == 3
    assert 0 < values["target_mixed"] < 1 and values["step_concentration"] > 0
    assert "Calibrated from the bank" in format_bench(res)
    # uniform ran, so both predictors were also read in the bench, on its arm (beside the fit)
    steps = res["calibration"]["in_bench"]
    assert all(0 <= steps[side]["selection_precision"] <= 1 for side in ("bank", "simulated"))
    assert (steps["steps"], steps["repetitions"]) == (1, 10) and "In the bench" in format_bench(res)


def test_calibration_keeps_the_knobs_you_set(tmp_path):
    from bank_fixtures import write_synthetic_bank

    from trace_gym.bench.sim_calibration import calibrated

    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", [1, 3, 5, 7] * 8, roots=8, continuations=4, turns=3)
    cfg, info = calibrated(SimBenchConfig(calibrate_from=str(path), mean_success=0.3, candidates=16, root_budget=8,
                                          pool_size=400, steps=2, warmup_steps=0))
    assert cfg.mean_success == 0.3 and info["kept"] == {"mean_success": 0.3} and "mean_success" not in info["values"]
    assert cfg.max_turns == 3 and info["values"]["max_turns"] == 3


def test_checks_are_typed_records_written_as_before():
    """``bench_checks`` gives :class:`Check` records; ``--json`` writes each as the
    ``{"name", "status", "detail"}`` object it always was, and reads it back."""
    checks = bench_checks(_fake([0.3, 0.4, 0.35, 0.3, 0.45, 0.4], [0.1] * 6))
    assert checks and all(isinstance(c, Check) for c in checks)
    one = Check("trace effective ratio above uniform", "PASS", "0.367 vs 0.100")
    assert results_json({"checks": [one], "seeds": 2}) == json.dumps(
        {"checks": [{"name": one.name, "status": "PASS", "detail": one.detail}], "seeds": 2}, indent=2)
    written = json.loads(results_json({"checks": checks}))["checks"]
    assert [Check.from_json(c) for c in written] == checks
    assert [c.failed for c in (one, dataclasses.replace(one, status="FAIL"))] == [False, True]
    with pytest.raises(ValueError, match=r"^a check's status is PASS, FAIL, NOT SHOWN or SKIP, got 'OK'$"):
        Check("x", "OK", "")
    with pytest.raises(TypeError, match="a bench result holds a object"):
        results_json({"x": object()})


def test_with_common_draws_arms_that_ask_alike_read_alike_as_a_bank_benchs_do():
    """Prompts that read alike to the predictor (prompts_alike) leave PCL the candidates uniform takes; with
    common draws the two arms then run the same branches, every repetition's headline the same (a bank bench's
    PCL and uniform on the guessing bank: identical in each of 180 repetitions). Without, each arm draws its own."""
    kw = dict(strategies=("uniform", "pcl"), oracle_upper_bound=False, prompts_alike=True, seeds=3, steps=2,
              warmup_steps=0, root_budget=64)
    rows = {common: run_sim(common_draws=common, **kw)["strategies"] for common in (True, False)}
    ratio = {c: {n: [r["effective_ratio"] for r in rows[c][n]["per_rep"]] for n in ("uniform", "pcl")} for c in rows}
    assert ratio[True]["uniform"] == ratio[True]["pcl"]
    assert len(set(ratio[True]["uniform"])) > 1  # not a constant
    assert ratio[False]["uniform"] != ratio[False]["pcl"]
