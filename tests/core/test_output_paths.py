"""Output paths are checked when a command starts, and a write that fails at the end keeps the
results (issue 44, class C2).

Every path a command writes to (``--json FILE``, ``--out DIR``, ``out=``, ``run_dir=``) is
refused in one line naming it before any work: a folder where a file goes, a file where a
folder goes, a parent that is a file. Tripwires turn a model load, an engine or a bench's
run into a test failure, so each refusal is shown to come first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trace_gym import cli

BANK = str(Path(__file__).resolve().parents[2] / "trace_gym" / "banks" / "data" / "guess_number_smollm2.jsonl.gz")
TINY_SIM = ["bench", "--sim", "seeds=1", "steps=2", "warmup_steps=0", "pool_size=64", "candidates=16", "root_budget=8",
            "strategies=uniform,trace", "oracle_upper_bound=false"]


@pytest.fixture
def places(tmp_path):
    """A folder and a plain file to misuse as outputs."""
    folder, file = tmp_path / "a_folder", tmp_path / "a_file.txt"
    folder.mkdir()
    file.write_text("not a folder\n")
    return folder, file


@pytest.mark.parametrize("case", ["bench --json folder", "bench --json file/r.json", "bench --out file",
                                  "bank stats --json folder", "eval out=file", "compare --out file",
                                  "bank record out=file/b.jsonl.gz", "train run_dir=file"])
def test_a_bad_output_path_is_one_line_before_the_work(case, places, tmp_path, capsys, no_work):
    folder, file = places
    argv, named = {
        "bench --json folder": (["bench", "--sim", "--json", str(folder)], folder),
        "bench --json file/r.json": (["bench", "--sim", "--json", str(file / "r.json")], file / "r.json"),
        "bench --out file": (["bench", "--sim", "--out", str(file)], file),
        "bank stats --json folder": (["bank", "stats", BANK, "--json", str(folder)], folder),
        "eval out=file": (["eval", f"out={file}"], file),
        "compare --out file": (["compare", str(tmp_path / "run_a"), str(tmp_path / "run_b"), "--out", str(file)], file),
        "bank record out=file/b.jsonl.gz": (["bank", "record", f"out={file / 'b.jsonl.gz'}"], file / "b.jsonl.gz"),
        "train run_dir=file": (["train", "--dry-run", f"run_dir={file}"], file),
    }[case]
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, (rc, err)
    assert str(named) in err[0] and ("folder" in err[0] or "file" in err[0]), err[0]
    assert file.read_text() == "not a folder\n" and not any(folder.iterdir())  # nothing written


@pytest.mark.parametrize("kind, bad", [("file", "folder"), ("folder", "file"), ("file", "parent file")])
def test_output_problem_names_what_is_in_the_way(kind, bad, places):
    from trace_gym.runs.output_paths import check_output

    folder, file = places
    path = {"folder": folder, "file": file, "parent file": file / "x" / "r.json"}[bad]
    with pytest.raises(ValueError, match=f"^--x '{path}' ") as info:
        check_output(path, kind, key="--x")
    assert str(file if bad == "parent file" else path) in str(info.value)
    check_output(folder / "new" / "r.json", "file", key="--x")  # a path to be created is fine
    check_output(folder, "folder", key="--x")


def test_a_write_that_fails_at_the_end_keeps_the_text_beside(places):
    from trace_gym.runs.output_paths import write_output_text

    folder, _ = places
    with pytest.raises(ValueError, match=f"^--json '{folder}' could not be written .*; the results are in ") as info:
        write_output_text(folder, '{"done": true}', key="--json")
    kept = Path(str(info.value).rsplit("the results are in ", 1)[1].split(" instead")[0])
    assert kept.parent == folder.parent and json.loads(kept.read_text()) == {"done": True}


def test_a_finished_bench_keeps_its_results_when_the_json_path_turns_into_a_folder(tmp_path, capsys, monkeypatch):
    """The path was fine at the start; a folder appears there while the bench runs (another job)."""
    from trace_gym.commands import bench

    target = tmp_path / "results.json"
    real = bench.format_bench

    def format_then_plant(results):
        target.mkdir()  # after the run, before the write
        return real(results)

    monkeypatch.setattr(bench, "format_bench", format_then_plant)
    rc = cli.main([*TINY_SIM, "--json", str(target)])
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if "error" in line]
    assert rc == 2 and len(err) == 1 and str(target) in err[0], captured.err
    kept = Path(err[0].rsplit("the results are in ", 1)[1].split(" instead")[0])
    assert sorted(json.loads(kept.read_text())["strategies"]) == ["trace", "uniform"]
    assert "uniform" in captured.out  # the table was printed before the write
