"""``trace-gym eval`` as a user meets it (issue 20): cache keys follow the data files'
contents, a missing local file or a mistyped policy is one line and exit 2 with no
network, env ids and registered suites are suites, per-turn progress, transcripts, and
the help text naming the real keys."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from pathlib import Path

import pytest
from test_plugins import write_plugin

from evaluators import suites
from evaluators.run import EvalConfig, cache_key, content_hashes, run_eval
from trace_gym.cli import main

#: agent-loop limits that keep a tiny-model episode to a fraction of a second
FAST = ["max_turns=2", "max_turn_tokens=4", "max_episode_tokens=1024", "progress=false"]


def _write_math(path: Path, n: int) -> None:
    rows = [{"problem": f"What is {i} + 2?", "answer": str(i + 2), "id": i} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a connection is recorded (and refused); the hub is off too."""
    attempts = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"test: no network ({address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    return attempts


# ---------------------------------------------------------------------- 1. cache keys follow file contents
def test_appending_a_task_to_a_local_file_is_a_fresh_result(tmp_path, tiny_model_path):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    _write_math(data / "aime24.jsonl", 2)
    cfg = EvalConfig(policy=(str(tiny_model_path),), suites=("aime24",), data_dir=str(data), limit=0,
                     max_turns=1, max_turn_tokens=4, max_episode_tokens=1024, out=str(tmp_path / "out"),
                     cache_dir=str(tmp_path / "cache"), progress=False)
    (first,) = run_eval(cfg)
    assert first["tasks"] == 2 and not first["cached"]
    (again,) = run_eval(cfg)
    assert again["cached"] and again["tasks"] == 2
    with open(data / "aime24.jsonl", "a") as f:  # same path, one more problem
        f.write(json.dumps({"problem": "What is 7 + 2?", "answer": "9", "id": 2}) + "\n")
    (grown,) = run_eval(cfg)
    assert not grown["cached"] and grown["tasks"] == 3 and "aime24/2" in grown["per_task"]
    # the key is the content, not the mtime: the same bytes written again are still the cache entry
    text = (data / "aime24.jsonl").read_text()
    time.sleep(0.01)
    (data / "aime24.jsonl").write_text(text)
    (same,) = run_eval(cfg)
    assert same["cached"] and same["tasks"] == 3
    memo = json.loads((tmp_path / "cache" / "file_hashes.json").read_text())
    entry = memo[str((data / "aime24.jsonl").resolve())]
    assert entry[2] == hashlib.sha256((data / "aime24.jsonl").read_bytes()).hexdigest()


def test_content_hashes_of_files_and_folders_by_hand(tmp_path):
    folder = tmp_path / "index"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"alpha")
    (folder / "sub" / "b.bin").write_bytes(b"beta")
    memo = tmp_path / "memo.json"
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    want = sha(f"a.bin:{sha(b'alpha')}\nsub/b.bin:{sha(b'beta')}".encode())
    assert content_hashes([folder, folder / "a.bin"], memo) == {str(folder): want, str(folder / "a.bin"): sha(b"alpha")}
    # memoised by (path, size, mtime): a stamped entry is trusted without reading the file
    saved = json.loads(memo.read_text())
    saved[str((folder / "a.bin").resolve())][2] = "memo"
    memo.write_text(json.dumps(saved))
    assert content_hashes([folder / "a.bin"], memo)[str(folder / "a.bin")] == "memo"
    (folder / "a.bin").write_bytes(b"alpha!")  # a new size: hashed again
    assert content_hashes([folder / "a.bin"], memo)[str(folder / "a.bin")] == sha(b"alpha!")


def test_index_files_named_in_env_kwargs_are_in_the_key(tmp_path):
    index = tmp_path / "bm25"
    index.mkdir()
    (index / "docs.jsonl").write_text('{"id": 1}\n')
    cfg = EvalConfig(env_kwargs={"searcher": f"bm25:{index}"}, cache_dir=str(tmp_path / "cache"))
    before = cache_key(cfg, "w", "generated")
    assert cache_key(cfg, "w", "generated") == before
    (index / "docs.jsonl").write_text('{"id": 1}\n{"id": 2}\n')
    assert cache_key(cfg, "w", "generated") != before
    remote = EvalConfig(env_kwargs={"searcher": "http://127.0.0.1:9/"}, cache_dir=str(tmp_path / "cache"))
    assert cache_key(remote, "w", "generated")  # a URL is no local file (and nothing is fetched)


# ---------------------------------------------------------------------- 2. one-line input errors, no network
def test_data_dir_without_the_suite_file_is_one_line_exit_2_offline(tmp_path, capsys, no_network):
    empty = tmp_path / "empty"
    empty.mkdir()
    t0 = time.perf_counter()
    code = main(["eval", "--suite", "aime24", f"data_dir={empty}", f"out={tmp_path / 'out'}",
                 f"cache_dir={tmp_path / 'cache'}"])
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert str(empty) in err[0] and "aime24.jsonl" in err[0] and "aime24.parquet" in err[0]
    assert no_network == [] and seconds < 10
    assert not (tmp_path / "out").exists()  # failed before anything ran
    # a data_dir that does not exist at all: the same one line
    assert main(["eval", "--suite", "math500", f"data_dir={tmp_path / 'nowhere'}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "does not exist" in line and "math500.jsonl" in line and no_network == []


def test_unknown_policy_and_suite_are_one_line_with_a_suggestion(tmp_path, capsys, no_network):
    assert main(["eval", "--policy", "smollm2-13m", f"out={tmp_path}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'smollm2-13m'" in line and "did you mean smollm2-135m" in line
    (tmp_path / "plain").mkdir()
    assert main(["eval", "--policy", str(tmp_path / "plain"), f"out={tmp_path}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "neither a model (no config.json) nor a run dir" in line
    assert main(["eval", "--suite", "aime2", f"out={tmp_path}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unknown suite 'aime2'" in line and "did you mean aime24" in line
    assert no_network == []


# ---------------------------------------------------------------------- 3. env ids and registered suites
@pytest.fixture
def echo_plugin(tmp_path, monkeypatch):
    """The plugin's env id, strategy and suite must not leak into later tests."""
    from registry_fixtures import registries_restored

    site = tmp_path / "site"
    write_plugin(site, installed=False)
    monkeypatch.syspath_prepend(str(site))
    with registries_restored(lambda name, module: name.split(".")[0] == "echo_local"):
        yield "echo_local"


def test_a_plugin_env_id_is_a_suite_end_to_end(tmp_path, tiny_model_path, echo_plugin):  # noqa: F811
    out = tmp_path / "out"
    args = ["--plugin", echo_plugin, "eval", "--policy", str(tiny_model_path), "--suite", "EchoLocal-v0", "limit=3",
            f"out={out}", f"cache_dir={tmp_path / 'cache'}", *FAST]
    assert main(args) == 0
    (row,) = json.loads((out / "results.json").read_text())
    assert row["suite"] == "EchoLocal-v0" and row["tasks"] == 3 and not row["cached"]
    assert all(task_id.startswith("echo/") for task_id in row["per_task"])
    # the held-out split of the plugin's loader: only prompts trace-gym train never trains on
    tasks = suites.get_suite("EchoLocal-v0").load(3)
    assert {t.prompt for t in tasks} <= {"Reply with the number 0.", "Reply with the number 1."}
    assert main(args) == 0 and json.loads((out / "results.json").read_text())[0]["cached"]


def test_register_suite_names_a_plugin_suite_for_eval_and_train(tmp_path, tiny_model_path, echo_plugin):  # noqa: F811
    import importlib

    from trace_gym.api import register_suite

    importlib.import_module(echo_plugin)  # registers EchoLocal-v0 with its task loader
    suite = register_suite("echo_suite", "EchoLocal-v0", max_turns=1, description="echo, one turn")
    assert suite.env_id == "trace_gym/EchoLocal-v0" and suites.get_suite("echo_suite") is suite
    assert register_suite("echo_suite", "EchoLocal-v0", max_turns=1) is suite  # the same again: a no-op
    with pytest.raises(ValueError, match="'echo_suite' is taken"):
        register_suite("echo_suite", "GuessNumber-v0")
    with pytest.raises(ValueError, match="unknown field"):
        register_suite("echo_other", "EchoLocal-v0", max_turn=1)
    with pytest.raises(ValueError, match="scorer must be one of 'reward', 'qa', 'bfcl', got 'f1'"):
        register_suite("echo_other", "EchoLocal-v0", scorer="f1")  # scorers come from evaluators.scoring.SCORERS
    out = tmp_path / "out"
    assert main(["eval", "--policy", str(tiny_model_path), "--suite", "echo_suite", "limit=2", f"out={out}",
                 f"cache_dir={tmp_path / 'cache'}", "max_turn_tokens=4", "progress=false"]) == 0
    (row,) = json.loads((out / "results.json").read_text())
    assert row["suite"] == "echo_suite" and row["tasks"] == 2
    # train's eval_suite takes a registered suite and an env id alike
    from trace_gym.commands.train import resolve_train_setup
    from trace_gym.train.config import TrainConfig

    for name in ("echo_suite", "EchoLocal-v0"):
        setup = resolve_train_setup(TrainConfig(eval_suite=name, eval_every=1))
        assert setup.evaluate is not None and name in setup.describe["eval"]
    with pytest.raises(ValueError, match="unknown suite 'echo_suit'.*did you mean echo_suite"):
        resolve_train_setup(TrainConfig(eval_suite="echo_suit", eval_every=1))


# ---------------------------------------------------------------------- 4. progress per turn, limits in help
def test_progress_moves_per_turn_before_any_episode_ends(monkeypatch, tiny_engine):  # noqa: F811
    import tqdm.auto

    seen = []

    class Recorder(tqdm.auto.tqdm):
        def set_postfix_str(self, s="", refresh=True):
            seen.append((self.n, s))
            return super().set_postfix_str(s, refresh)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    suite = suites.get_suite("guess_number")  # an env family: every episode lasts until max_turns
    tasks = suite.load(2, heldout_fraction=0)
    episodes = suites.run_episodes(tiny_engine, suite, tasks, samples=1, temperature=0.0, seed=0, max_turns=3,
                                   max_turn_tokens=3, max_episode_tokens=1024, progress=True)
    assert [len(e) for e in episodes] == [1, 1]
    turns = sum(len(ep.turns) for e in episodes for ep in e)
    assert turns >= 4
    assert (0, "turns 2") in seen  # the first round reported, both episodes still running
    assert seen[-1] == (2, f"turns {turns}")


def test_eval_help_names_the_keys_and_the_suite_limits(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "data_path" not in text and "data_dir" in text
    bfcl = suites.SUITES["bfcl"]
    assert f"max_turns {bfcl.max_turns}, max_turn_tokens {bfcl.max_turn_tokens}" in text
    from trace_gym.commands.eval import BFCL_CPU

    assert f"--suite bfcl {BFCL_CPU}" in text and "--dump-episodes N" in text
    docs = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    assert BFCL_CPU in docs and "data_path" not in docs
    for name, suite in suites.SUITES.items():  # the docs' table states every suite's limits
        assert f"{suite.max_turns} / {suite.max_turn_tokens} / {suite.max_episode_tokens}" in docs, name


# ---------------------------------------------------------------------- 5. transcripts
def test_dump_episodes_writes_messages_answer_and_verdict(tmp_path, tiny_model_path):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    _write_math(data / "aime24.jsonl", 3)
    out = tmp_path / "out"
    args = ["eval", "--policy", str(tiny_model_path), "--suite", "aime24", f"data_dir={data}", "limit=0",
            "--dump-episodes", "2", f"out={out}", f"cache_dir={tmp_path / 'cache'}", *FAST]
    assert main(args) == 0
    (row,) = json.loads((out / "results.json").read_text())
    path = Path(row["episode_file"])
    assert path.parent == out and path.name.startswith("episodes-") and path.name.endswith("-aime24.jsonl")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 2 and [r["task_id"] for r in records] == ["aime24/0", "aime24/1"]
    for r, gold in zip(records, ("2", "3")):
        assert r["suite"] == "aime24" and r["reward"] == row["per_task"][r["task_id"]][r["sample"]]
        roles = [m["role"] for m in r["messages"]]
        assert "assistant" in roles and r["messages"][roles.index("assistant")]["content"] == r["turns"][0]["action"]
        assert r["prompt"] and r["turns"] and "answer" in r
        verdict = r["verdict"]
        assert verdict["success"] == (r["reward"] >= 0.5)
        if verdict["grading"] is not None:  # the episode reached the grader (else the loop cut it first)
            assert verdict["grading"]["gold"] == gold and r["answer"] == verdict["grading"]["extracted"]
    path.unlink()
    assert main(args) == 0  # a cached repeat writes the same transcripts again
    (again,) = json.loads((out / "results.json").read_text())
    assert again["cached"] and [json.loads(x) for x in path.read_text().splitlines()] == records
    with pytest.raises(ValueError, match=r"dump_episodes: expected an int in \[0, 1000000\], got -1"):
        EvalConfig(dump_episodes=-1)


@pytest.mark.slow
def test_bfcl_cpu_setting_runs_four_entries(tmp_path, smollm2_path):  # noqa: F811
    """The documented CPU setting: one entry per category, at most 6 turns of 96 tokens each
    (2.5 min on an idle 2-core machine; wall time on a shared machine is not asserted)."""
    from trace_gym.commands.eval import BFCL_CPU

    assert main(["eval", "--policy", "smollm2-135m", "--suite", "bfcl", *BFCL_CPU.split(), f"out={tmp_path}",
                 "cache=false", "progress=false"]) == 0
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["tasks"] == 4 and sorted(c["entries"] for c in row["bfcl"]["categories"].values()) == [1, 1, 1, 1]
    assert 0 < row["generated_tokens"] <= 4 * 6 * 96  # the setting bounds the work: 4 entries x 6 turns x 96
