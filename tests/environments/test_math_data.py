"""Dataset loaders (local files in each hub schema; nothing is downloaded) and the generated family."""

from __future__ import annotations

import json
import sys

import pytest
import sympy

from environments.math_python.data import DATASETS, EVAL_SETS, load_tasks
from trace_gym.env.datafiles import read_rows
from environments.math_python.generated import generate_tasks

ROWS = {
    "deepscaler": [{"problem": "What is 1+1?", "answer": "2", "solution": "1+1=2"},
                   {"problem": "Half of 1?", "answer": "\\frac{1}{2}", "solution": "..."}],
    "aime24": [{"id": 60, "problem": "AIME problem", "solution": "s", "answer": "204", "url": "u", "year": 2024}],
    "amc23": [{"id": 0, "question": "AMC question", "answer": 27.0}],
    "math500": [{"problem": "Convert", "solution": "s", "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
                 "subject": "Precalculus", "level": 2, "unique_id": "test/precalculus/807.json"}],
    "minerva": [{"question": "Minerva q", "answer": "7.5e-3"}],
    "olympiadbench": [{"id": 1606, "question": "Olympiad q", "final_answer": ["$\\frac{1}{2}$"],
                       "is_multiple_answer": False, "unit": None, "answer_type": "Numerical"}],
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_local_jsonl_in_the_hub_schema(tmp_path, name):
    tasks = load_tasks(name, path=write_jsonl(tmp_path / f"{name}.jsonl", ROWS[name]))
    rows = ROWS[name]
    spec = DATASETS[name]
    assert len(tasks) == len(rows)
    for task, row in zip(tasks, rows):
        assert task.prompt == row[spec.question_field] and task.source == name
        assert task.answer == (row[spec.answer_field] if isinstance(row[spec.answer_field], list)
                               else str(row[spec.answer_field]))
        assert spec.question_field not in task.metadata and spec.answer_field not in task.metadata
    assert len({t.id for t in tasks}) == len(tasks)


def test_ids_come_from_the_row_when_present(tmp_path):
    (task,) = load_tasks("math500", path=write_jsonl(tmp_path / "m.jsonl", ROWS["math500"]))
    assert task.id == "math500/test/precalculus/807.json" and task.metadata["subject"] == "Precalculus"
    tasks = load_tasks("deepscaler", path=write_jsonl(tmp_path / "d.jsonl", ROWS["deepscaler"]))
    assert [t.id for t in tasks] == ["deepscaler/0", "deepscaler/1"]


def test_directory_json_aliases_and_limit(tmp_path):
    (tmp_path / "test.json").write_text(json.dumps(ROWS["minerva"] * 3))
    assert len(load_tasks("MinervaMath", path=str(tmp_path))) == 3
    assert len(load_tasks("minerva_math", path=str(tmp_path), limit=2)) == 2
    assert set(EVAL_SETS) == {"aime24", "amc23", "math500", "minerva", "olympiadbench"}


def test_loaded_tasks_drive_the_env(tmp_path):
    from environments.math_python.env import MathPythonEnv

    tasks = load_tasks("olympiadbench", path=write_jsonl(tmp_path / "o.jsonl", ROWS["olympiadbench"]))
    env = MathPythonEnv(tasks, prestart_kernel=False)
    try:
        env.reset(seed=0)
        assert env.step("\\boxed{0.5}")[1] == 1.0
    finally:
        env.close()


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "test.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS["olympiadbench"]), path)
    (task,) = load_tasks("olympiadbench", path=str(path))
    assert task.answer == ["$\\frac{1}{2}$"]


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(ImportError, match="pyarrow"):
        read_rows(str(path))


def test_hub_loading_needs_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="HuggingFaceH4/MATH-500"):
        load_tasks("math500")


def test_hub_loading_uses_the_hub_id_and_split(monkeypatch):
    calls = []

    class FakeDatasets:
        @staticmethod
        def load_dataset(hub_id, split):
            calls.append((hub_id, split))
            return ROWS["aime24"]

    monkeypatch.setitem(sys.modules, "datasets", FakeDatasets)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the fake stands for datasets reading its cache: the hub is not probed
    (task,) = load_tasks("aime24")
    assert calls == [("HuggingFaceH4/aime_2024", "train")] and task.answer == "204"


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown math dataset"):
        load_tasks("gsm9k")
    with pytest.raises(ValueError, match="no 'final_answer' field"):
        load_tasks("olympiadbench", path=write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}]))
    with pytest.raises(ValueError, match="unsupported file type"):
        read_rows(str(tmp_path / "x.csv"))


def test_generated_tasks_are_deterministic_and_levelled():
    a, b = generate_tasks(20, difficulty=(0, 1, 2, 3, 4), seed=3), generate_tasks(20, difficulty=(0, 1, 2, 3, 4), seed=3)
    assert a == b and [t.prompt for t in a] == [t.prompt for t in b]
    assert [t.metadata["difficulty"] for t in a[:5]] == [0, 1, 2, 3, 4]
    assert len({t.id for t in a}) == 20
    assert [t.prompt for t in generate_tasks(5, 2, seed=4)] != [t.prompt for t in generate_tasks(5, 2, seed=3)]
    assert load_tasks("generated", n=3, difficulty=4, seed=1) == generate_tasks(3, 4, 1)


@pytest.mark.parametrize("level", range(5))
def test_generated_answers_are_correct(level):
    """Re-derive each answer from the question text (parsed with latex2sympy, not the generator's code)."""
    from latex2sympy2_extended import latex2sympy

    x = sympy.Symbol("x")
    for task in generate_tasks(10, level, seed=11):
        answer = latex2sympy(task.answer)
        maths = task.prompt.split("$")[1::2]  # the LaTeX pieces of the question
        if level == 0:
            assert sympy.simplify(latex2sympy(maths[0]) - answer) == 0
        elif level == 1:
            assert sympy.simplify(sympy.nsimplify(latex2sympy(maths[0])) - answer) == 0
        elif level == 2:
            lhs, rhs = (latex2sympy(side) for side in maths[1].split(" = "))
            assert sympy.simplify((lhs - rhs).subs(x, answer)) == 0
        elif level == 3 and "roots" in task.prompt:
            r = sympy.Poly(latex2sympy(maths[2].removesuffix(" = 0")), x).all_roots()
            assert sum(v**2 for v in r) == answer
        elif level == 4 and task.prompt.startswith("Find the sum"):
            poly = latex2sympy(maths[1].removesuffix(" = 0"))
            assert sum(set(sympy.solve(poly, x))) == answer
        assert task.answer and task.source == "generated"


def test_generated_rejects_bad_difficulty():
    with pytest.raises(ValueError, match="difficulty"):
        generate_tasks(3, difficulty=5)
    with pytest.raises(ValueError, match="difficulty"):
        generate_tasks(3, difficulty=())


def test_both_loaders_keep_array_metadata_as_lists_and_drop_binary_columns():
    import numpy as np

    from environments.math_python.data import rows_to_tasks
    from environments.wiki_qa.data import row_to_task

    extra = {"levels": np.array([1, 2]), "image": b"\x89PNG", "note": "kept"}
    math_task = rows_to_tasks("aime24", [{"problem": "1+1?", "answer": "2", **extra}], DATASETS["aime24"])[0]
    qa_task = row_to_task({"question": "q", "golden_answers": ["a"], "metadata": extra}, "nq")
    for task in (math_task, qa_task):
        assert task.metadata["levels"] == [1, 2] and task.metadata["note"] == "kept"
        assert "image" not in task.metadata
