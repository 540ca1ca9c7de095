"""Issue 35, item 3: evaluated checkpoints compared as strategies are (``compare`` on eval
output dirs, paired on shared tasks, labelled by the user's names); ``eval`` takes every key
as a flag; a mistyped flag is one did-you-mean line, exit 2."""

from __future__ import annotations

import json
import math

import pytest
from test_compare import make_run
from test_eval_user import FAST, _write_math

from trace_gym import report
from trace_gym.cli import main
from trace_gym.runs.compare import run_compare


def _eval_dir(path, rows):
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps(rows))
    return path


def _row(policy, suite, scores):
    return {"policy": policy, "label": policy, "suite": suite, "tasks": len(scores), "samples": 1,
            "accuracy": sum(scores) / len(scores), "per_task": {f"{suite}/{i}": [float(s)] for i, s in enumerate(scores)}}


def test_two_real_evals_are_paired_on_their_shared_tasks(tmp_path, tiny_model_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    _write_math(data / "aime24.jsonl", 3)
    common = ["--policy", str(tiny_model_path), "--suite", "aime24", "--data-dir", str(data),
              "--cache-dir", str(tmp_path / "cache"), *FAST]
    assert main(["eval", *common, "--out", str(tmp_path / "a"), "--limit", "3"]) == 0
    assert main(["eval", *common, "--out", str(tmp_path / "b"), "--limit", "2", "--seed", "1"]) == 0
    rows_a = json.loads((tmp_path / "a" / "results.json").read_text())
    rows_b = json.loads((tmp_path / "b" / "results.json").read_text())
    assert rows_a[0]["tasks"] == 3 and rows_b[0]["tasks"] == 2  # --limit reached the config
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--names", "base,tuned",
                 "--out", str(tmp_path / "cmp")]) == 0
    text = capsys.readouterr().out
    # the expected numbers, recomputed from the two files' per-task rewards on the 2 shared tasks
    a, b = rows_a[0]["per_task"], rows_b[0]["per_task"]
    shared = sorted(set(a) & set(b))
    assert shared == ["aime24/0", "aime24/1"]
    diff, lo, hi, n = report.paired_proportion_difference([float(b[t][0] >= 0.5) for t in shared],
                                                          [float(a[t][0] >= 0.5) for t in shared])
    tuned = next(line for line in text.splitlines() if line.startswith("| tuned "))
    assert f"{100 * diff:+.1f} pts [{100 * lo:+.1f}, {100 * hi:+.1f}] (paired over 2 shared tasks)" in tuned
    assert "cannot be told apart" in tuned  # 2 tasks can never tell two policies apart
    assert "reference" in next(line for line in text.splitlines() if line.startswith("| base "))
    assert "trace / treerpo" not in text
    assert (tmp_path / "cmp" / "accuracy.png").stat().st_size > 1000
    assert (tmp_path / "cmp" / "compare.md").read_text().strip() == text.split("\n\nwrote ")[0].strip()


def test_paired_numbers_by_hand_and_several_policies_per_dir(tmp_path):
    base = [0] * 30 + [1] * 10
    better = [1] * 12 + [0] * 18 + [1] * 10  # 12 of 40 tasks flipped to correct, none lost
    a = _eval_dir(tmp_path / "evA", [_row("m0", "math500", base)])
    b = _eval_dir(tmp_path / "evB", [_row("m1", "math500", better + [1] * 5), _row("m2", "math500", base),
                                     _row("m1", "aime24", [1, 0])])
    text = run_compare([a, b])
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")]
    rows = {f"{c[0]}|{c[1]}": c for c in cells}
    # m1 - m0 on the 40 shared tasks (m1's 5 extra tasks are not paired): Agresti-Min [+14.1, +43.0]
    centre, v = 12 / 42, (13 / 42 - (12 / 42) ** 2) / 42
    lo, hi = 100 * (centre - 1.959964 * math.sqrt(v)), 100 * (centre + 1.959964 * math.sqrt(v))
    assert f"+30.0 pts [{lo:+.1f}, {hi:+.1f}] (paired over 40 shared tasks): distinguishable" == rows["evB:m1|math500"][4]
    assert rows["evB:m1|math500"][2:4] == ["45", "60.0 [45.5, 73.0]"]  # its accuracy is over all 45 of its tasks
    assert rows["evB:m2|math500"][4] == "+0.0 pts [-4.7, +4.7] (paired over 40 shared tasks): cannot be told apart"
    assert rows["evB:m1|aime24"][4] == "no shared tasks (evA did not evaluate aime24)"
    assert rows["evA|math500"][3:] == ["25.0 [14.2, 40.2]", "reference"]


def test_an_eval_dir_pairs_with_a_run_dirs_last_evaluation(tmp_path):
    run = make_run(tmp_path / "run", "trace", 0, [0.2], after=[1, 1, 0, 0], before=[0, 0, 0, 0])
    cfg = (run / "config.yaml").read_text() + "eval_suite: math500\n"
    (run / "config.yaml").write_text(cfg)
    per_task = json.loads((run / "evals" / "step-1.json").read_text())
    (run / "evals" / "step-1.json").write_text(json.dumps(per_task | {"suite": "math500"}))
    ev = _eval_dir(tmp_path / "ev", [{**_row("x", "math500", [0, 0, 0, 0]),
                                      "per_task": {f"t{i}": [0.0] for i in range(4)}}])
    text = run_compare([ev, run], names=["before", "after"])
    line = next(line for line in text.splitlines() if line.startswith("| after@1 "))
    assert "+50.0 pts" in line and "(paired over 4 shared tasks)" in line


def test_bad_eval_dirs_and_names_are_one_line(tmp_path, capsys, monkeypatch):
    good = _eval_dir(tmp_path / "good", [_row("m", "s", [1, 0])])
    bad = _eval_dir(tmp_path / "bad", [{"suite": "s", "per_task": {"t": ["x"]}}])
    assert main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "per_task['t']" in err[0] and "finite rewards" in err[0]
    assert main(["compare", str(good), str(good), "--names", "one"]) == 2
    assert "--names needs 2 distinct" in capsys.readouterr().err
    from trace_gym.runs import compare_arms

    monkeypatch.setattr(compare_arms, "MAX_EVAL_RESULTS_BYTES", 10)  # bounded before any parse
    with pytest.raises(ValueError, match="more than 10 bytes"):
        compare_arms.load_eval_arms(good, "g")
    assert main(["compare", str(tmp_path)]) == 2
    assert "neither a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("argv, want", [
    (["eval", "--limt", "2"], "unknown flag --limt; did you mean --limit"),
    (["eval", "--out-dir", "x"], "unknown flag --out-dir; did you mean --data-dir, --out"),
    (["bench", "--bank", "math_python_smollm2", "--stratgies", "uniform,trace"],
     "unknown flag --stratgies; did you mean --strategies"),
    (["train", "--stps", "3"], "unknown flag --stps; did you mean --steps"),
    (["compare", "a", "b", "--nmes", "x,y"], "unknown flag --nmes; did you mean --names?"),
])
def test_a_mistyped_flag_is_one_did_you_mean_line(argv, want, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and want in err[0], err
