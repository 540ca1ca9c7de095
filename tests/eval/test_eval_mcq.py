"""The paper's out-of-domain suites (issue 24): MMLU-Pro, ARC-Challenge and GPQA-diamond as
multiple-choice suites in the math env. Option-letter grading on hand-written and hostile
responses, the loaders on small local files in each hub schema (jsonl and parquet; nothing
is downloaded), GPQA's fixed answer order, MMLU-Pro's per-category breakdown by hand, and
``trace-gym eval`` on all three through the CLI with SmolLM2-135M, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_eval_user import no_network  # noqa: F401  (fixture)

from environments.math_python.choice import LETTERS, MAX_SCAN_CHARS, ChoiceGrader, extract_choice
from evaluators import choice, suites
from evaluators.math.metrics import clustered_wilson_interval
from evaluators.run import EvalConfig, data_path, format_results
from trace_gym.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "mcq"
NAMES = ("mmlu_pro", "arc_c", "gpqa_diamond")


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------- 1. grading
#: (response, gold, reason, extracted): four options, as ARC and GPQA
CASES = [
    ("\\boxed{C}", "C", "correct", "C"),                                      # a boxed letter
    ("The options differ in sign. \\boxed{B}", "C", "wrong_letter", "B"),     # another letter
    ("\\boxed{A, C}", "C", "several_letters", "A, C"),                         # several letters, boxed
    ("answer: A or B", "A", "several_letters", "A or B"),                      # several letters, in prose
    ("\\boxed{AC}", "C", "several_letters", "AC"),
    ("\\boxed{A \\text{ and } C}", "C", "several_letters", "A \\text{ and } C"),
    ("\\boxed{A B C D}", "A", "several_letters", "A B C D"),                 # every option listed: a hedge
    ("The answer is A B C", "A", "several_letters", "A B C"),
    ("The answer is A B or C", "A", "several_letters", "A B or C"),
    ("\\boxed{A\\\\B\\\\C\\\\D}", "A", "several_letters", "A\\\\B\\\\C\\\\D"),  # LaTeX line breaks join
    ("The answer is A I guess", "A", "correct", "A"),                          # a capital before a word: prose
    ("\\boxed{c}", "C", "correct", "C"),                                      # lower case
    ("So the answer is b.", "B", "correct", "B"),
    ("I think B is wrong, the answer is C", "C", "correct", "C"),              # a letter inside prose
    ("B looks tempting. The answer is (C).", "C", "correct", "C"),
    ("**Answer:** D", "D", "correct", "D"),
    ("Final answer: option D", "D", "correct", "D"),
    ("\\boxed{\\text{(B)}}", "B", "correct", "B"),
    ("$\\boxed{\\textbf{D}}$", "D", "correct", "D"),
    ("\\boxed{C) 42 kg}", "C", "correct", "C"),                                # the option's text after it
    ("First \\boxed{A}, then on reflection \\boxed{D}", "D", "correct", "D"),  # the last box counts
    ("\\boxed{D}. Hmm, the answer is A", "D", "correct", "D"),                 # a box beats a phrase
    ("The answer is C, because D fails", "C", "correct", "C"),
    ("I cannot decide between them.", "A", "no_answer", None),                 # no answer
    ("B and C are close.", "B", "no_answer", None),                            # letters, but no answer named
    ("", "A", "no_answer", None),
    ("\\boxed{42}", "A", "no_choice_letter", "42"),
    ("the answer is a prime number", "A", "no_choice_letter", "a prime number"),  # "a" is an article here
    ("\\boxed{E}", "A", "no_choice_letter", "E"),                              # not one of the four letters
    ("\\boxed{}", "A", "no_choice_letter", ""),
]


@pytest.mark.parametrize("response,gold,reason,extracted", CASES)
def test_grading_hand_written_responses(response, gold, reason, extracted):
    result = ChoiceGrader("ABCD").grade(response, gold)
    assert (result.reason, result.extracted) == (reason, extracted)
    assert result.correct == (reason == "correct") and result.gold == gold and not result.infra_error


def test_mmlu_pro_letters_reach_j_and_the_choice_record():
    grader = ChoiceGrader()  # A-J
    assert grader.grade("\\boxed{J}", "J").correct and grader.grade("\\boxed{E}", "E").correct
    assert ChoiceGrader("ABCD").grade("\\boxed{J}", "D").reason == "no_choice_letter"
    found = extract_choice("x \\boxed{b} y")
    assert (found.letters, found.letter, found.span, found.source) == (("B",), "B", "b", "boxed")
    found = extract_choice("answer: A, or C")
    assert found.letters == ("A", "C") and found.letter is None and found.source == "phrase"
    assert grader.grade("\\boxed{a}", "a").correct  # a lower-case gold is the same letter


#: hostile model output: sizes and shapes that must neither raise nor take long
HOSTILE = [
    "x" * 10**6 + "\\boxed{C}",                      # 1 MB, answer at the end
    "\\boxed{C}" + "x" * 10**6,                      # 1 MB after the answer: past the scanned tail
    "\\boxed{" * 200_000,                            # 1.4 MB of unclosed boxes
    "\\boxed{" + "{" * 500_000 + "C" + "}" * 500_000,  # nested a million deep
    "{" * 10**6,
    "\x00" * 10**6 + "answer: C",                    # NUL bytes
    "\\boxed{\x00C\x00}",
    "answer is " * 100_000,
    "answer: " + "A, " * 300_000,
    "\\boxed{C}\ud800\udfff",                        # lone surrogates
    "\\boxed{" + "A or " * 20 + "C}",
    "\\boxed{" + "A or " * 50 + "C}",             # a box longer than 128 characters is skipped
]


@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_hostile_text_is_bounded(i):
    grader = ChoiceGrader("ABCD")
    t0 = time.perf_counter()
    result = grader.grade(HOSTILE[i], "C")
    assert time.perf_counter() - t0 < 0.5
    assert result.reason in ("correct", "wrong_letter", "several_letters", "no_choice_letter", "no_answer")
    assert result.extracted is None or len(result.extracted) <= 128
    expected = {0: "correct", 1: "no_answer", 2: "no_answer", 5: "correct", 6: "correct", 9: "correct",
                10: "several_letters", 11: "no_answer"}
    if i in expected:
        assert result.reason == expected[i], result
    json.dumps(result.info())  # the verdict goes into the transcripts' JSON


def test_non_text_responses_and_bad_inputs():
    grader = ChoiceGrader("ABCD")
    for response in (None, b"\\boxed{C}", 3, ["C"]):
        assert grader.grade(response, "C").reason == "no_answer"
    box = "\\boxed{C}"  # read while it lies in the last MAX_SCAN_CHARS characters, not once it starts before
    assert grader.grade(box + "y" * (MAX_SCAN_CHARS - len(box)), "C").correct
    assert grader.grade(box + "y" * (MAX_SCAN_CHARS - len(box) + 1), "C").reason == "no_answer"
    with pytest.raises(ValueError, match="gold of a choice task must be one of the letters 'ABCD', got 'E'"):
        grader.grade("\\boxed{E}", "E")
    with pytest.raises(ValueError, match="gold of a choice task"):
        grader.grade("\\boxed{A}", ["A"])
    for bad in ("", "abcd", "AAB", "A1", 4):
        with pytest.raises(ValueError, match="letters must be distinct upper-case"):
            ChoiceGrader(bad)


def test_a_choice_task_runs_in_the_math_env():
    import gymnasium

    import trace_gym  # noqa: F401  (registers the ids)

    suite = suites.SUITES["gpqa_diamond"]
    (task,) = choice.load_tasks("gpqa_diamond", path=str(DATA / "gpqa_diamond.jsonl"), limit=1)
    env = gymnasium.make(suite.env_id, disable_env_checker=True, prestart_kernel=False, **suite.env_kwargs)
    try:
        obs, _ = env.reset(seed=0, options={"task": task})
        assert obs[-1].content == task.prompt and "\\boxed{}" in obs[-1].content
        _, reward, terminated, _, info = env.step(f"The answer is \\boxed{{{task.answer}}}.")
        assert reward == 1.0 and terminated and info["grading"]["reason"] == "correct"
        env.reset(seed=0, options={"task": task})
        _, reward, _, _, info = env.step("\\boxed{A, B}")
        assert reward == 0.0 and info["grading"]["reason"] == "several_letters"
    finally:
        env.close()


# ---------------------------------------------------------------------- 2. loaders
def test_loaders_read_each_hub_schema():
    mmlu = choice.load_tasks("mmlu_pro", path=str(DATA / "mmlu_pro.jsonl"))
    assert [t.id for t in mmlu] == ["mmlu_pro/70", "mmlu_pro/71", "mmlu_pro/72", "mmlu_pro/73"]
    assert [t.answer for t in mmlu] == ["B", "E", "B", "D"]
    assert [t.metadata["category"] for t in mmlu] == ["math", "biology", "math", "biology"]
    assert mmlu[1].metadata["gold_text"] == "Chloroplast" and len(mmlu[0].metadata["options"]) == 10
    assert mmlu[2].metadata["options"] == ["x", "2x", "x^2", "2"]  # the "N/A" options are dropped
    assert mmlu[0].prompt == ("What is 6 times 7?\n\n" + "\n".join(
        f"{letter}. {o}" for letter, o in zip("ABCDEFGHIJ", rows("mmlu_pro")[0]["options"]))
        + "\n\nAnswer with the letter of the correct option (A-J) in \\boxed{}.")
    arc = choice.load_tasks("arc_c", path=str(DATA / "arc_c.jsonl"))
    assert [t.answer for t in arc] == ["A", "D", "D"]  # answerKey "4" of labels "1".."4" is D
    assert arc[1].id == "arc_c/NYSEDREGENTS_2015_4_8" and arc[1].metadata["gold_text"] == "an iron nail"
    assert "\nD. an iron nail\n" in arc[1].prompt and "(A-D)" in arc[1].prompt
    assert "\nE. uranium\n" in arc[2].prompt and "(A-E)" in arc[2].prompt  # a five-option row
    gpqa = choice.load_tasks("gpqa_diamond", path=str(DATA / "gpqa_diamond.jsonl"))
    for task, row in zip(gpqa, rows("gpqa_diamond")):
        assert task.id == f"gpqa_diamond/{row['Record ID']}" and task.metadata["High-level domain"]
        assert task.metadata["gold_text"] == row["Correct Answer"].strip()
        shown = task.metadata["options"]
        assert sorted(shown) == sorted(row[k].strip() for k in ("Correct Answer", "Incorrect Answer 1",
                                                                 "Incorrect Answer 2", "Incorrect Answer 3"))
        assert shown["ABCD".index(task.answer)] == task.metadata["gold_text"]
    assert "Canary String" not in gpqa[0].metadata  # only the descriptive fields are kept
    assert len(choice.load_tasks("arc_c", path=str(DATA / "arc_c.jsonl"), limit=2)) == 2


def test_parquet_in_the_hub_schema_through_data_dir(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for name in NAMES:  # arc_c's nested choices {text, label} become a parquet struct, as on the hub
        pq.write_table(pa.Table.from_pylist(rows(name)), tmp_path / f"{name}.parquet")
    cfg = EvalConfig(suites=NAMES, data_dir=str(tmp_path))
    for name in NAMES:
        path = data_path(cfg, name)
        assert path == str(tmp_path / f"{name}.parquet")
        from_parquet = suites.load_suite_tasks(suites.SUITES[name], None, path)
        assert from_parquet == choice.load_tasks(name, path=str(DATA / f"{name}.jsonl"))
    folder = tmp_path / "folder" / "gpqa_diamond"  # a hub-layout folder holds {split}.<ext>: GPQA's split is train
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows("gpqa_diamond")), folder / "train.parquet")
    assert data_path(EvalConfig(suites=("gpqa_diamond",), data_dir=str(folder.parent)), "gpqa_diamond") == str(folder)
    assert len(choice.load_tasks("gpqa_diamond", path=str(folder))) == 3


def test_malformed_rows_are_named(tmp_path):
    def load(name, row):
        (tmp_path / "x.jsonl").write_text(json.dumps(row) + "\n")
        return choice.load_tasks(name, path=str(tmp_path / "x.jsonl"))

    good = rows("mmlu_pro")[0]
    with pytest.raises(ValueError, match="mmlu_pro row 0 has no 'options' field"):
        load("mmlu_pro", {k: v for k, v in good.items() if k != "options"})
    with pytest.raises(ValueError, match="'answer' 'C' disagrees with 'answer_index' 1"):
        load("mmlu_pro", {**good, "answer": "C"})
    with pytest.raises(ValueError, match="index into its 10 options, got 12"):
        load("mmlu_pro", {**good, "answer_index": 12})
    assert load("mmlu_pro", {k: v for k, v in good.items() if k != "answer_index"})[0].answer == "B"
    with pytest.raises(ValueError, match="has 11 options; expected 2 to 10"):
        load("mmlu_pro", {**good, "options": good["options"] + ["x"], "answer": "B"})
    with pytest.raises(ValueError, match="has 11 options; expected 2 to 10"):
        load("mmlu_pro", {**good, "options": good["options"] + ["x"], "answer": None, "answer_index": 10})
    with pytest.raises(ValueError, match="has 1 options; expected 2 to 10"):
        load("mmlu_pro", {**good, "options": ["x", "N/A"], "answer": "A", "answer_index": 0})
    arc = rows("arc_c")[1]
    with pytest.raises(ValueError, match="answerKey '5' is none of the labels"):
        load("arc_c", {**arc, "answerKey": "5"})
    with pytest.raises(ValueError, match="'choices' must be"):
        load("arc_c", {**arc, "choices": ["a", "b"]})
    gpqa = rows("gpqa_diamond")[0]
    with pytest.raises(ValueError, match="gpqa_diamond row 0 has no 'Incorrect Answer 3' field"):
        load("gpqa_diamond", {k: v for k, v in gpqa.items() if k != "Incorrect Answer 3"})
    with pytest.raises(ValueError, match="unknown multiple-choice set 'mmlu'"):
        choice.load_tasks("mmlu")


def test_hub_loading_uses_the_declared_ids(monkeypatch):
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(*args, split):
            calls.append((*args, split))
            return rows({"TIGER-Lab/MMLU-Pro": "mmlu_pro", "allenai/ai2_arc": "arc_c"}.get(args[0], "gpqa_diamond"))

    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the fake stands for datasets reading its cache: the hub is not probed
    for name in NAMES:
        local = choice.load_tasks(name, str(DATA / f"{name}.jsonl"), 1)
        assert suites.load_suite_tasks(suites.SUITES[name], 1) == local
    assert calls == [("TIGER-Lab/MMLU-Pro", "test"), ("allenai/ai2_arc", "ARC-Challenge", "test"),
                     ("Idavidrein/gpqa", "gpqa_diamond", "train")]
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"Idavidrein/gpqa \(config gpqa_diamond\)"):
        choice.load_tasks("gpqa_diamond")


def synthetic_gpqa(n: int) -> list[dict]:
    return [{"Question": f"Synthetic question {i}: which value is right?", "Correct Answer": f"right {i}",
             "Incorrect Answer 1": f"wrong {i}a", "Incorrect Answer 2": f"wrong {i}b",
             "Incorrect Answer 3": f"wrong {i}c", "Record ID": f"rec{i:04d}", "High-level domain": "Physics"}
            for i in range(n)]


def test_gpqa_gold_letter_is_spread_and_stable(tmp_path):
    path = tmp_path / "gpqa_diamond.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in synthetic_gpqa(40)))
    first = choice.load_tasks("gpqa_diamond", path=str(path))
    golds = [t.answer for t in first]
    assert set(golds) == set("ABCD") and max(golds.count(x) for x in "ABCD") <= 20
    assert choice.load_tasks("gpqa_diamond", path=str(path)) == first  # two loads agree
    code = ("import json, sys\nfrom evaluators.choice import load_tasks\n"
            f"print(json.dumps([t.answer for t in load_tasks('gpqa_diamond', path={str(path)!r})]))\n")
    for seed in ("0", "12345"):  # a fresh interpreter, another hash seed: the same letters
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == golds
    # the order is sha256 of the question and the answer's index, pinned here (any change re-letters GPQA)
    assert choice.gpqa_order("Synthetic question 0: which value is right?") == [0, 2, 1, 3]
    assert golds[0] == "A"


# ---------------------------------------------------------------------- 3. scoring, table, help
def test_mmlu_pro_breakdown_by_hand():
    tasks = choice.load_tasks("mmlu_pro", path=str(DATA / "mmlu_pro.jsonl"))  # math, biology, math, biology
    rewards = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    episodes = [[SimpleNamespace(reward=r, own_turns=[SimpleNamespace(action_ids=[1, 2])]) for r in rs]
                for rs in rewards]
    result = suites.score_episodes(suites.SUITES["mmlu_pro"], tasks, episodes, pass_k=(1, 2))
    assert result["accuracy"] == pytest.approx(3 / 8) and result["pass_at_k"] == {"1": 0.375, "2": 0.5}
    groups = result["breakdown"]["groups"]
    assert result["breakdown"]["by"] == "category" and list(groups) == ["biology", "math"]
    math_, bio = groups["math"], groups["biology"]
    assert (math_["tasks"], math_["accuracy"], math_["pass_at_k"]) == (2, 0.5, {"1": 0.5, "2": 0.5})
    assert (bio["tasks"], bio["accuracy"], bio["pass_at_k"]) == (2, 0.25, {"1": 0.25, "2": 0.5})
    assert math_["accuracy_ci"] == pytest.approx(clustered_wilson_interval([[1, 1], [0, 0]]))
    assert bio["accuracy_ci"] == pytest.approx(clustered_wilson_interval([[0, 1], [0, 0]]))
    assert "breakdown" not in suites.score_episodes(suites.SUITES["arc_c"], tasks, episodes)
    row = {**result, "label": "ReAct (no RL): m", "seconds": 1.0, "cached": False}
    text = format_results([row])
    assert "mmlu_pro by category, ReAct (no RL): m:" in text
    assert "| biology  | 2     | 25.0 [" in text and "| 50.0     |" in text


def test_the_suite_table_help_and_docs(capsys):
    for name in NAMES:
        suite = suites.SUITES[name]
        assert suite.env_id == "trace_gym/MathPython-v0" and suite.scorer == "reward" and suite.data_file
        assert not suite.offline and dict(suite.env_kwargs)["grader"] == ChoiceGrader(choice.DATASETS[name].letters)
    assert suites.SUITES["mmlu_pro"].breakdown == "category" and not suites.SUITES["gpqa_diamond"].breakdown
    assert choice.LETTERS == LETTERS  # repeated in evaluators.choice to keep the suite table light
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    for name in NAMES:
        assert f"  {name}: {suites.SUITES[name].description}\n      {suites.SUITES[name].limits()}" in text
    docs = (ROOT / "docs" / "evaluation.md").read_text()
    for needle in ("`mmlu_pro`", "`arc_c`", "`gpqa_diamond`", "TIGER-Lab/MMLU-Pro", "allenai/ai2_arc",
                   "Idavidrein/gpqa", "several_letters", "zero-shot"):
        assert needle in docs, needle
    # the suite table stays light: the grader's module (and the math env's sympy) load only when an env does
    out = subprocess.run([sys.executable, "-c", "import sys, evaluators.suites\n"
                          "print(sorted(m for m in sys.modules if m.startswith(('environments', 'sympy'))))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]


def test_a_missing_file_is_one_line_with_no_network(tmp_path, capsys, no_network):  # noqa: F811
    (tmp_path / "mmlu_pro.jsonl").write_text((DATA / "mmlu_pro.jsonl").read_text())
    code = main(["eval", "--suite", "mmlu_pro,gpqa_diamond", f"data_dir={tmp_path}", f"out={tmp_path / 'out'}",
                 f"cache_dir={tmp_path / 'cache'}"])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and str(tmp_path) in line and "gpqa_diamond.jsonl" in line and "gpqa_diamond.parquet" in line
    assert no_network == [] and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- 4. end to end through the CLI
def test_eval_cli_runs_the_three_suites_offline(tmp_path, capsys, smollm2_path, no_network):  # noqa: F811
    out = tmp_path / "out"
    t0 = time.perf_counter()
    code = main(["eval", "--policy", "smollm2-135m", "--suite", ",".join(NAMES), f"data_dir={DATA}", "limit=2",
                 "max_turns=1", "max_turn_tokens=12", "max_episode_tokens=1024", "--dump-episodes", "2",
                 f"out={out}", f"cache_dir={tmp_path / 'cache'}", "progress=false"])
    seconds = time.perf_counter() - t0
    assert code == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert [r["suite"] for r in results] == list(NAMES) and all(r["tasks"] == 2 for r in results)
    assert sorted(results[0]["per_task"]) == ["mmlu_pro/70", "mmlu_pro/71"]
    assert set(results[0]["breakdown"]["groups"]) == {"biology", "math"}
    for name in NAMES:
        assert f"| {name}" in printed
    assert "mmlu_pro by category" in printed and (out / "results.md").read_text().strip() == printed.strip()
    for row in results:
        for record in map(json.loads, Path(row["episode_file"]).read_text().splitlines()):
            grading = record["verdict"]["grading"]
            if grading is not None:  # the episode reached the grader (else the loop cut it first)
                assert grading["gold"] in "ABCDE" and grading["reason"] in (
                    "correct", "wrong_letter", "several_letters", "no_choice_letter", "no_answer")
    assert no_network == []
    print(f"three suites, two tasks each: {seconds:.1f} s")
