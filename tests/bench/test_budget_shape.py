"""benchmarks/budget_shape.py's comparison (issue 45, item 5), on hand-made bank-bench results: two
shapes paired by repetition, a verdict word per strategy and metric, and NO VERDICT when a shape's
bank ran out."""

from __future__ import annotations

import pytest

from trace_gym import report
from benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def bs():
    with benchmark_script("budget_shape") as module:
        yield module


def row(ratios, mixed, exhausted=0.0) -> dict:
    reps = [{"effective_ratio": e, "mixed_prompts": m, "mixed_per_1k_tokens": 1.0, "exhausted_share": exhausted,
             "roots_needed": 16, "continuations_needed": 24} for e, m in zip(ratios, mixed)]
    out = {"per_rep": reps, "repetitions": len(reps), "upper_bound": False, "predictor": "p",
           "exhausted_share": exhausted}
    for key in ("effective_ratio", "mixed_prompts"):
        out[key], out[key + "_ci"], _ = report.mean_ci([r[key] for r in reps])
    return out


def results(tree, trace, exhausted=0.0) -> dict:
    return {"strategies": {"random_tree": row(*tree, exhausted), "trace": row(*trace, exhausted)},
            "bank": {"roots": 16, "continuations": 24}}


WIDE_TREE = ([0.5, 0.6, 0.55, 0.5, 0.6], [2, 2.4, 2.2, 2, 2.4])
DEEP_TREE = ([0.4, 0.45, 0.4, 0.35, 0.5], [1, 1.2, 1.1, 1, 1.2])  # below WIDE_TREE in every repetition
TRACE = ([0.7, 0.8, 0.7, 0.75, 0.8], [4, 4.5, 4, 4.2, 4.4])
TRACE_NOISY = ([0.8, 0.7, 0.75, 0.7, 0.8], [4.4, 4, 4.2, 4.5, 4])  # the same values, other repetitions


def test_the_default_shapes_spend_one_nominal_budget(bs):
    assert [bs.nominal(s) for s in bs.SHAPES] == [32.0, 32.0] and bs.label((16, 2.0)) == "(16, 2)"


def test_the_shapes_are_paired_by_repetition(bs):
    out = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(DEEP_TREE, TRACE_NOISY)},
                     bs.STRATEGIES)
    words = {(r["strategy"], r["metric"]): r["word"] for r in out["rows"]}
    assert words == {("random_tree", "effective ratio"): "shown above",
                     ("random_tree", "mixed prompts/step"): "shown above",
                     ("trace", "effective ratio"): "not shown", ("trace", "mixed prompts/step"): "not shown"}
    first = out["rows"][0]
    assert first["first"] == pytest.approx(0.55) and first["second"] == pytest.approx(0.42)
    assert first["pair"]["difference"] == pytest.approx(0.13) and first["pair"]["n"] == 5
    assert bs.sentence(out) == ("random_tree: (16, 2) beats (8, 6) on both headline metrics; trace: (16, 2) and "
                                "(8, 6) cannot be told apart on either headline metric")
    assert out["verdict"]
    mixed = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(WIDE_TREE, ([0.75] * 5, [3] * 5))},
                       ("trace",))
    assert bs.sentence(mixed) == ("trace: (16, 2) and (8, 6) not told apart on effective ratio, (16, 2) above (8, 6) "
                                  "on mixed prompts/step")


def test_a_shape_whose_bank_ran_out_gives_no_verdict_naming_what_it_needed(bs):
    out = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(DEEP_TREE, TRACE, exhausted=0.3)},
                     bs.STRATEGIES)
    assert not out["verdict"] and list(out["exhausted"]) == ["(8, 6)"]
    assert {r["word"] for r in out["rows"]} == {"no verdict"}
    text = bs.table("t", out, ["cmd"])
    assert "NO VERDICT" in text and "24 continuations per recorded prefix" in text


def test_the_simulators_words_are_set_beside_the_banks(bs):
    bank = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(DEEP_TREE, TRACE_NOISY)},
                      bs.STRATEGIES)
    sim = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(WIDE_TREE, TRACE_NOISY)},
                     bs.STRATEGIES)
    lines = bs.table("t", bank, ["cmd"], sim).splitlines()
    tree = [line for line in lines if line.startswith("| random_tree | effective ratio")][0]
    assert tree.endswith("| **no** |") and "not shown (0.550 vs 0.550)" in tree


def test_bad_seeds_are_one_line(bs, capsys):
    assert bs.main(["--seeds", "1"]) == 2
    assert "--seeds must be >= 2" in capsys.readouterr().err


def test_from_a_folder_without_the_json_is_one_line(bs, tmp_path):
    with pytest.raises(SystemExit, match=r"bank-16x2\.json does not exist: run without --from"):
        bs.main(["b", "--from", str(tmp_path)])


def test_the_simulator_runs_the_bank_benchs_shape_and_warm_up(bs):
    config = {"candidates": 5, "group_size": 4, "steps": 3, "warmup_steps": 0, "warmup_prompts": 4}
    args = bs.sim_args("b", (8, 6.0), 10, config)
    assert args[:6] == ["bench", "--sim", "calibrate_from=b", "root_budget=8", "continuations_per_root=6", "seeds=10"]
    assert {"candidates=5", "group_size=4", "steps=3", "warmup_steps=0", "warmup_prompts=4"} <= set(args)
    unset = bs.sim_args("b", (8, 6.0), 10, {**config, "warmup_prompts": None})
    assert not any(a.startswith("warmup_prompts") for a in unset)


def test_the_simulators_word_is_the_one_most_of_its_blocks_say(bs):
    """Three blocks of 5 paired repetitions: random tree's (8, 6) is the (16, 2) rows' own values in the
    first block (not shown) and below them in the other two (shown above): the word is 'shown above',
    each block's word printed; with two blocks of no difference it is 'not shown'."""
    def blocky(deep_in):
        deep = [DEEP_TREE if d else WIDE_TREE for d in deep_in]
        wide = results((WIDE_TREE[0] * 3, WIDE_TREE[1] * 3), (TRACE[0] * 3, TRACE[1] * 3))
        other = results((sum((b[0] for b in deep), []), sum((b[1] for b in deep), [])),
                        (TRACE_NOISY[0] * 3, TRACE_NOISY[1] * 3))
        return {(16, 2.0): wide, (8, 6.0): other}

    out = bs.by_blocks(blocky([False, True, True]), bs.STRATEGIES, 5)
    tree = out["rows"][0]
    assert tree["blocks"] == ["not shown", "shown above", "shown above"] and tree["word"] == "shown above"
    assert out["rows"][0]["pair"]["n"] == 15  # means and intervals of the whole run
    assert bs.by_blocks(blocky([False, False, True]), bs.STRATEGIES, 5)["rows"][0]["word"] == "not shown"
    bank = bs.compare({(16, 2.0): results(WIDE_TREE, TRACE), (8, 6.0): results(DEEP_TREE, TRACE_NOISY)},
                      bs.STRATEGIES)
    line = [ln for ln in bs.table("t", bank, ["cmd"], out).splitlines() if ln.startswith("| random_tree | eff")][0]
    assert "blocks: not shown, shown above, shown above)" in line and line.endswith("| yes |")


def test_sim_seeds_below_one_block_are_one_line(bs, capsys):
    assert bs.main(["--sim", "--sim-seeds", "10"]) == 2
    assert "--sim-seeds must be >= --seeds (30: one block), got 10" in capsys.readouterr().err
