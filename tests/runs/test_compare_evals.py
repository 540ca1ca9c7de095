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


# issue 44 B: what compare is given that it cannot count right, each one line (exit 2)
def _dup_task_id(root):
    (root / "x").mkdir()
    (root / "x" / "results.json").write_text('[{"policy": "p", "suite": "s", "per_task": '
                                             '{"s/0": [1.0], "s/0": [0.0], "s/1": [1.0]}}]')
    return root / "x", "repeats the key 's/0' in one object, where JSON keeps only the last"


def _dup_policy_suite(root):
    return _eval_dir(root / "x", [_row("p", "s", [1, 0]), _row("p", "s", [0, 0])]), \
        "row 1: policy 'p' on suite 's' again (row 0 has it)"


def _symlink_loop(root):
    (root / "loop").symlink_to(root / "loop")
    return root / "loop", "'loop' cannot be read (Too many levels of symbolic links)"


def _run_with(root, file, text, said, mode="w"):
    """A run dir ``x`` whose ``file`` is written (or appended to) with ``text``; ``said``."""
    run = make_run(root / "x", "trace", 0, [0.2, 0.3], after=[1, 0], before=[0, 0])
    with open(run / file, mode) as f:
        f.write(text)
    return run, said


def _per_task_a_list(root):
    return _run_with(root, "evals/step-2.json", json.dumps({"accuracy": 0.5, "per_task": [1.0, 0.0]}),
                     "evals/step-2.json: per_task is list, expected an object")


def _dup_task_id_in_a_run(root):
    return _run_with(root, "evals/step-2.json", '{"accuracy": 0.5, "per_task": {"t0": [1.0], "t0": [0.0]}}',
                     "repeats the key 't0'")


def _seconds_a_list(root):
    return _run_with(root, "metrics.jsonl", json.dumps({"step": 3, "reward": 0.1, "seconds": [1, 2]}) + "\n",
                     "metrics.jsonl step 3: seconds is '[1, 2]', expected an object of phase -> seconds", "a")


def _reward_a_string(root):
    return _run_with(root, "metrics.jsonl", json.dumps({"step": 3, "reward": "high"}) + "\n",
                     "metrics.jsonl step 3: reward is 'high', expected a number", "a")


BAD_INPUTS = {f.__name__.strip("_"): f for f in (_dup_task_id, _dup_policy_suite, _symlink_loop, _per_task_a_list,
                                                 _dup_task_id_in_a_run, _seconds_a_list, _reward_a_string)}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_what_compare_cannot_count_right_is_one_line(tmp_path, monkeypatch, capsys, case):
    good = _eval_dir(tmp_path / "good", [_row("p", "s", [1, 0])]) if case in ("dup_task_id", "dup_policy_suite") \
        else make_run(tmp_path / "good", "uniform", 0, [0.2, 0.3], after=[1, 0], before=[0, 0])
    monkeypatch.chdir(tmp_path)
    bad, said = BAD_INPUTS[case](tmp_path)
    assert main(["compare", "good", str(bad.relative_to(tmp_path))]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and captured.out == "", captured
    assert good.exists()


def test_a_bar_in_a_name_is_escaped_and_keeps_the_table_whole(tmp_path):
    a = _eval_dir(tmp_path / "a", [_row("p", "s", [1, 0, 1])])
    text = run_compare([a, a], names=["x|y", "two\nlines"])
    table = [line for line in text.splitlines() if line.startswith("|")]
    unescaped = [line.replace("\\|", "") for line in table]
    assert len({line.count("|") for line in unescaped}) == 1  # every row as many cells as the header
    assert table[0].count("minus x\\|y") == 1 and any(line.startswith("| two lines ") for line in table)


def test_a_step_repeated_by_a_torn_resume_is_counted_once_the_later_record_winning(tmp_path):
    run = make_run(tmp_path / "r", "trace", 0, [0.2, 0.4], after=[1, 0], before=[0, 0])
    with open(run / "metrics.jsonl", "a") as f:  # step 2 again, as a resume that tore its write leaves it
        f.write(json.dumps({"step": 2, "reward": 0.8, "nominal_budget": 16.0, "generated_tokens": 200,
                            "step_seconds": 10.0, "effective_ratio": 0.4}) + "\n")
    text = run_compare([run])
    assert "note: run 'r': metrics.jsonl gives step(s) 2 more than once (a resumed run's torn write); each step " \
        "is counted once, its later record" in text
    row = next(line for line in text.splitlines() if line.startswith("| r (1 seed)"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # 2 steps; effective ratio (0.1 + 0.4) / 2 and reward (0.2 + 0.8) / 2, the later step 2 counted; budget 2 x 16
    assert cells[1:6] == ["2", "0.250", "0.500", "32", "300"]
