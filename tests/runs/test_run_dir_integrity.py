"""Run dirs and run files hold against what a crash, a bad copy or a hand edit leaves: what a
run reads and writes lies inside the directory it locks (or the link is refused, named); a
checkpoint is complete only when its manifest lists exactly the plain files present and at
least those every step writes; every reader of a run file (manifest, state.json,
metrics.json(l), config.yaml, eval cache entries) is bounded and total; cache writes are
atomic per writer, and a torn or interleaved cache entry is a miss."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest

from run_dir_checks import assert_refused_untouched
from trace_gym.runs.checkpoint import TRAINING_STEP_FILES, read_state, write_manifest
from trace_gym.runs.run_dir import RunDir
from trace_gym.train.loop import config_differences


def rec(step):
    return {"step": step, "reward": step / 10}


def training_files(folder: Path, step: int) -> None:
    """What a training step writes into its checkpoint (the names; small contents)."""
    (folder / "policy").mkdir()
    (folder / "policy" / "config.json").write_text("{}")
    (folder / "policy" / "model.safetensors").write_bytes(b"w" * 64)
    for name in ("trainer.pt", "predictor.pt", "rng.pt"):
        (folder / name).write_bytes(b"t" * 16)
    (folder / "state.json").write_text(json.dumps({"step": step, "cursor": {"epoch": 0, "position": 2 * step},
                                                   "fallback_first": False}))


def run_with(path: Path, steps: int, **kw) -> RunDir:
    run = RunDir(path, **kw)
    run.start("a: 1\n")
    for s in range(1, steps + 1):
        run.commit(s, rec(s), lambda f, s=s: training_files(f, s), keep=0)
    run.close()
    return run


def rewrite_manifest(folder: Path, files: dict | None = None, **fields) -> None:
    """Recompute the manifest as an editor would (over what is there, or the given ``files``)."""
    write_manifest(folder, int(folder.name.split("-")[1]))
    manifest = json.loads((folder / "manifest.json").read_text())
    if files is not None:
        manifest["files"] = files
    (folder / "manifest.json").write_text(json.dumps({**manifest, **fields}))


# ---------------------------------------------------------------------- what a run locks
LINKS = [
    ("checkpoints", lambda a, b: (b / "checkpoints").symlink_to(a / "checkpoints"), "checkpoints leads to"),
    ("a step folder", lambda a, b: ((b / "checkpoints").mkdir(),
                                    (b / "checkpoints" / "step-2").symlink_to(a / "checkpoints" / "step-2")),
     "checkpoints/step-2 leads to"),
    ("metrics.jsonl", lambda a, b: (b / "metrics.jsonl").symlink_to(a / "metrics.jsonl"), "metrics.jsonl leads to"),
    ("config.yaml", lambda a, b: (b / "config.yaml").symlink_to(a / "config.yaml"), "config.yaml leads to"),
    ("evals", lambda a, b: (b / "evals").symlink_to(a), "evals leads to"),
    (".lock", lambda a, b: (b / ".lock").symlink_to(a / "elsewhere.lock"), ".lock is a link"),
]


@pytest.mark.parametrize("name, plant, message", LINKS, ids=[c[0] for c in LINKS])
def test_what_a_run_reads_and_writes_lies_inside_what_it_locks(tmp_path, name, plant, message):
    a = run_with(tmp_path / "a", 2, step_files=TRAINING_STEP_FILES)
    a.start("a: 1\n")  # run A is live (holds its lock)
    before = sorted(p.name for p in a.checkpoints.iterdir()), a.metrics_path.read_bytes()
    b_path = tmp_path / "b"
    b_path.mkdir()
    plant(a.path, b_path)
    b = RunDir(b_path, step_files=TRAINING_STEP_FILES)
    with pytest.raises(ValueError) as caught:
        b.start("a: 2\n")  # another config, which must not resume from A's step
    assert message in str(caught.value) and str(b_path) in str(caught.value) and "\n" not in str(caught.value)
    assert (sorted(p.name for p in a.checkpoints.iterdir()), a.metrics_path.read_bytes()) == before
    assert not (tmp_path / "a" / "elsewhere.lock").exists()  # nothing was written through a link
    a.close()


def test_a_link_that_stays_inside_the_run_dir_is_allowed(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    (run.path / "real-evals").mkdir()
    (run.path / "evals").symlink_to(run.path / "real-evals")
    assert run.start("a: 1\n") is None


# ---------------------------------------------------------------------- complete checkpoints
INCOMPLETE = [
    ("an unlisted file planted", lambda ck: (ck / "policy" / "extra.py").write_text("import os"),
     "policy/extra.py is not listed in manifest.json"),
    ('"files": {} over an emptied step', lambda ck: ([p.unlink() for p in ck.rglob("*") if p.is_file()],
                                                     rewrite_manifest(ck, files={})),
     "manifest.json lists no policy/config.json"),
    ('"files": {} over a full step', lambda ck: rewrite_manifest(ck, files={}), "is not listed in manifest.json"),
    ("a step file missing from disk and manifest", lambda ck: ((ck / "predictor.pt").unlink(), rewrite_manifest(ck)),
     "manifest.json lists no predictor.pt"),
    ("a listed link", lambda ck: ((ck / "rng.pt").unlink(), (ck / "rng.pt").symlink_to(ck.parent / "step-1" / "rng.pt"),
                                  rewrite_manifest(ck)), "rng.pt is a link"),
    ("state.json of another step", lambda ck: ((ck / "state.json").write_text('{"step": 1, "cursor": {"epoch": 0, '
                                                                              '"position": 0}}'), rewrite_manifest(ck)),
     "state.json is of step 1, expected 2"),
]


@pytest.mark.parametrize("name, damage, reason", INCOMPLETE, ids=[c[0] for c in INCOMPLETE])
def test_a_checkpoint_is_complete_only_with_exactly_its_files_and_every_step_file(tmp_path, name, damage, reason):
    run = run_with(tmp_path / "run", 2, step_files=TRAINING_STEP_FILES)
    damage(run.checkpoints / "step-2")
    again = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES)
    assert_refused_untouched(again.path, 2, reason, lambda: again.start("a: 1\n"), then="step-1 is then the newest")
    assert_refused_untouched(again.path, 2, reason, again.checkpoint_path, then="step-1 is then the newest")  # eval RUN
    (run.checkpoints / "step-2").rename(tmp_path / "step-2-aside")  # what the message says the user may do
    assert again.start("a: 1\n").step == 1


# ---------------------------------------------------------------------- bounded, total parsers
HOSTILE_MANIFESTS = [
    ("nested 100,000 deep", lambda ck: (ck / "manifest.json").write_text("[" * 100_000 + "]" * 100_000),
     "manifest.json is unreadable (manifest.json is nested more than"),
    ("files a list", lambda ck: rewrite_manifest(ck, files=["state.json"]), "files is list, expected an object"),
    ("an entry a string", lambda ck: rewrite_manifest(ck, files={"state.json": "abc"}), "entry of 'state.json' is"),
    ("a 5000-digit step", lambda ck: (ck / "manifest.json").write_text('{"step": ' + "9" * 5000 + "}"),
     "manifest.json is unreadable"),
    ("a list", lambda ck: (ck / "manifest.json").write_text("[]"), "manifest.json is a list"),
    ("a name outside the folder", lambda ck: rewrite_manifest(ck, files={"../../config.yaml": {"size": 5,
                                                                                             "sha256": "0" * 64}}),
     "lists '../../config.yaml', not a file inside"),
    ("state.json deep", lambda ck: ((ck / "state.json").write_text("{" * 50_000), rewrite_manifest(ck)),
     "state.json is unreadable"),
    ("state.json cursor a list", lambda ck: ((ck / "state.json").write_text('{"step": 2, "cursor": [0, 4]}'),
                                             rewrite_manifest(ck)), "state.json's cursor is [0, 4]"),
]


@pytest.mark.parametrize("name, damage, reason", HOSTILE_MANIFESTS, ids=[c[0] for c in HOSTILE_MANIFESTS])
def test_a_hostile_manifest_or_state_is_a_reason_never_a_raw_exception(tmp_path, name, damage, reason):
    run = run_with(tmp_path / "run", 2, step_files=TRAINING_STEP_FILES)
    damage(run.checkpoints / "step-2")
    again = RunDir(tmp_path / "run", step_files=TRAINING_STEP_FILES)
    assert_refused_untouched(again.path, 2, reason, lambda: again.start("a: 1\n"), then="step-1 is then the newest")


def test_read_state_checks_what_the_training_loop_reads(tmp_path):
    folder = tmp_path / "checkpoints" / "step-3"
    folder.mkdir(parents=True)
    for text, message in [('{"step": 3}', "cursor is None"), ('{"step": 3, "cursor": {"epoch": -1, "position": 0}}',
                                                              "cursor is {'epoch': -1"),
                          ('{"step": 3, "cursor": {"epoch": 0, "position": 0}, "fallback_first": "no"}',
                           "fallback_first is 'no'"), ("[" * 10_000, "state.json is unreadable")]:
        (folder / "state.json").write_text(text)
        with pytest.raises(ValueError, match="step-3: state.json"):
            read_state(folder, 3)
        try:
            read_state(folder, 3)
        except ValueError as exc:
            assert message in str(exc), exc
    (folder / "state.json").write_text('{"step": 3, "cursor": {"epoch": 1, "position": 2}}')
    assert read_state(folder, 3)["cursor"] == {"epoch": 1, "position": 2}


def test_unparsable_metrics_lines_are_skipped_as_documented(tmp_path):
    run = run_with(tmp_path / "run", 3)
    good = run.metrics_path.read_text()
    hostile = ['{"step": ' + "7" * 5000 + "}",  # past Python's digit limit (a raw ValueError before)
               '{"step": 9, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",  # RecursionError before
               '["step", 9]', '{"step": true}', '{"step": "9"}', '{"step": -1}', '{"step": 9, "x":',
               '{"step": 9, "pad": "' + "x" * (17 << 20) + '"}']  # longer than a line may be
    run.metrics_path.write_text(good + "\n".join(hostile) + "\n")
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    again = RunDir(tmp_path / "run")
    assert again.start("a: 1\n").step == 3  # and the resume rebuilds metrics.jsonl from the good lines
    assert run.metrics_path.read_text() == good


def test_a_hostile_config_yaml_is_one_line_naming_it(tmp_path):
    run = run_with(tmp_path / "run", 1)
    again = RunDir(tmp_path / "run")  # one object: its lock is taken once and kept
    for text in ["[" * 100_000, "a: [1, 2\n", "- 1\n- 2\n", "x" * (2 << 20)]:
        run.config_path.write_text(text)
        with pytest.raises(ValueError, match=r"config.yaml is unreadable \(\w+"):
            again.start("a: 1\n", compare=config_differences)


# ---------------------------------------------------------------------- the eval cache
def _cache_setup(tmp_path, monkeypatch, calls):
    from evaluators import suites
    from evaluators.run import EvalConfig

    (tmp_path / "aime24.jsonl").write_text(json.dumps({"problem": "1 + 1?", "answer": "2", "id": 0}))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")

    def fake_evaluate(engine, suite, **kw):
        calls.append(suite)
        return {"suite": suite, "tasks": 1, "samples": 1, "accuracy": 0.5, "pad": "x" * 200_000}
    monkeypatch.setattr(suites, "evaluate", fake_evaluate)
    cfg = EvalConfig(policy=(str(folder),), suites=("aime24",), data_dir=str(tmp_path), limit=0,
                     out=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"), progress=False)
    return cfg, folder


ENTRIES = [("torn", lambda good: good[: len(good) // 2]), ("interleaved", lambda good: good + good),
           ("nested 100,000 deep", lambda good: "[" * 100_000 + "]" * 100_000),
           ("a 5000-digit number", lambda good: '{"tasks": ' + "1" * 5000 + ', "samples": 1}'),
           ("not a result", lambda good: '{"tasks": "1", "samples": 1}'), ("a list", lambda good: "[1, 2]")]


@pytest.mark.parametrize("name, damage", ENTRIES, ids=[c[0] for c in ENTRIES])
def test_a_damaged_cache_entry_is_a_miss(tmp_path, monkeypatch, name, damage):
    from evaluators.run import evaluate_cached

    calls = []
    cfg, folder = _cache_setup(tmp_path, monkeypatch, calls)
    first, _ = evaluate_cached(cfg, folder, "aime24", engine=object())
    (entry,) = [p for p in (tmp_path / "cache").glob("*.json") if p.name != "file_hashes.json"]
    entry.write_text(damage(entry.read_text()))
    again, _ = evaluate_cached(cfg, folder, "aime24", engine=object())
    assert calls == ["aime24", "aime24"] and not again["cached"]  # evaluated again, not an error
    third, _ = evaluate_cached(cfg, folder, "aime24", engine=object())
    assert third["cached"] and calls == ["aime24", "aime24"]  # and the entry is whole again


def test_concurrent_cache_writers_never_share_a_temp_file(tmp_path, monkeypatch):
    from evaluators.run import evaluate_cached

    calls = []
    cfg, folder = _cache_setup(tmp_path, monkeypatch, calls)
    cfg = type(cfg)(**{**cfg.__dict__, "cache": False})  # every call evaluates and writes the entry
    errors, seen = [], []
    # the order is forced, not hoped for: the reader starts once an entry exists and reads
    # until every writer is done (one last pass after), so it always races live writers
    written, writers_done = threading.Event(), threading.Event()

    def writer():
        for _ in range(40):
            try:
                evaluate_cached(cfg, folder, "aime24", engine=object())
            except Exception as exc:  # noqa: BLE001  (what a shared temp file raises: the test's finding)
                errors.append(repr(exc))
            written.set()

    def read_once():
        for path in (tmp_path / "cache").glob("*.json"):
            if path.name != "file_hashes.json":
                try:
                    seen.append(hashlib.sha256(path.read_bytes()).hexdigest())
                    json.loads(path.read_text())
                except FileNotFoundError:
                    pass
                except ValueError as exc:
                    errors.append(f"a reader saw a torn entry: {exc}")

    def reader():
        written.wait()
        while not writers_done.is_set():
            read_once()
        read_once()
    writers = [threading.Thread(target=writer) for _ in range(4)]
    threads = writers + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in writers:
        t.join()
    writers_done.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert seen and not [p for p in (tmp_path / "cache").iterdir() if ".tmp" in p.name]  # no temp file left
