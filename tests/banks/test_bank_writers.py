"""Bank writers (issue 44, class F): one writer per bank file, across processes, held for the
writer's life; a manifest that carries no path of the recorder's machine."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bank_fixtures import ScriptedPolicy, small_family, synthetic_record

from trace_gym.agent.loop import AgentConfig
from trace_gym.banks import BankWriter, open_bank, read_header, record_bank
from trace_gym.banks.writer import lock_path, portable_command, portable_path, shared_policy_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
LIMITS = AgentConfig(max_turn_tokens=16, max_episode_tokens=512)

# A real recording that stops after its first prompt is durable: it says "locked" on stdout and
# waits for a line on stdin before it goes on (the test decides when, never a timer).
HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from bank_fixtures import ScriptedPolicy, small_family
    from trace_gym.agent.loop import AgentConfig
    from trace_gym.banks import record_bank

    def say(msg):
        if msg.startswith("prompt 1/"):
            print("locked", flush=True)
            sys.stdin.readline()

    out = record_bank({path!r}, engine=ScriptedPolicy(), family=small_family(), prompts=6, roots=2, continuations=1,
                      agent_config=AgentConfig(max_turn_tokens=16, max_episode_tokens=512), batch_prompts=1, say=say)
    print("recorded", out["recorded"], flush=True)
""")


def _second_writers(path: Path, holder_pid: int) -> None:
    """Every way a second writer can come at a bank that a live recording holds: each is refused
    in one line naming the holder, and none of them changes a byte of the file."""
    before = path.read_bytes()
    named = rf"bank '{path}' is in use by pid {holder_pid} on \S+ since 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d "
    cli = subprocess.run([sys.executable, "-m", "trace_gym.cli", "bank", "record", "--env", "guess_number",
                          "--policy", "smollm2-135m", f"out={path}", "prompts=6", "roots=2", "continuations=1"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    lines = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(lines) == 1, cli.stderr[-3000:]
    assert __import__("re").search(named, lines[0]) and "record into another file" in lines[0], lines
    with pytest.raises(ValueError, match=named):  # the library's recorder, in this (another) process
        record_bank(str(path), engine=ScriptedPolicy(), family=small_family(), prompts=6, roots=2, continuations=1,
                    agent_config=LIMITS)
    with pytest.raises(ValueError, match=named):  # a bare writer resuming the file
        BankWriter(path, read_header(path)["manifest"], resume=True)
    with pytest.raises(ValueError, match=named):  # a writer of a fresh file at the same path
        BankWriter(path, {"roots": 2, "continuations": 1}, resume=True)
    assert path.read_bytes() == before


def test_a_second_writer_is_refused_naming_the_first_and_the_bank_stays_whole(tmp_path):
    path = tmp_path / "one.jsonl.gz"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(tests=str(FIXTURES), path=str(path))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()[-3000:]
        assert lock_path(path).exists()
        _second_writers(path, holder.pid)
        holder.stdin.write("go on\n")
        holder.stdin.flush()
        assert holder.stdout.readline().split() == ["recorded", "6"]
        assert holder.wait(timeout=120) == 0
    finally:
        holder.kill()
        holder.wait()
    bank = open_bank(path)  # whole: every prompt once, the checksum right
    ids = [e.task_id for e in bank.entries]
    assert len(ids) == 6 == len(set(ids)) and bank.scan.footer["runs"] == 1
    assert not lock_path(path).exists()  # the writer removed its lock file as it let go
    done = record_bank(str(path), engine=ScriptedPolicy(), family=small_family(), prompts=6, roots=2,
                       continuations=1, agent_config=LIMITS)
    assert done["complete"] and done["recorded"] == 0  # and the next writer gets in


def test_one_process_cannot_hold_two_writers_of_one_bank_and_a_closed_writer_lets_go(tmp_path):
    path = tmp_path / "w.jsonl.gz"
    manifest = {"roots": 2, "continuations": 1}
    first = BankWriter(path, manifest)
    with pytest.raises(ValueError, match=rf"is in use by pid {os.getpid()} "):
        BankWriter(path, manifest, resume=True)
    first.start_run()
    first.add(synthetic_record(0, 1, 2, 1))
    first.close()
    with pytest.raises(ValueError, match="this writer was closed"):
        first.add(synthetic_record(1, 1, 2, 1))
    with BankWriter(path, manifest, resume=True) as second:
        assert second.present == {"synth/0"}
        second.start_run()
        second.add(synthetic_record(1, 1, 2, 1))
        second.finish()
    assert [e.task_id for e in open_bank(path).entries] == ["synth/0", "synth/1"]
    assert not lock_path(path).exists()
    (tmp_path / "dir.jsonl.gz.lock").mkdir()  # a folder where the lock belongs: one line
    with pytest.raises(ValueError, match=r"dir.jsonl.gz.lock is a folder, not the writer's lock file \(remove it\)"):
        BankWriter(tmp_path / "dir.jsonl.gz", manifest)


# ---------------------------------------------------------------------- the manifest
@pytest.mark.parametrize("given, expected", [
    ("{cwd}/banks/b.jsonl.gz", "banks/b.jsonl.gz"),        # inside the working folder: relative
    ("{other}/rec/b.jsonl.gz", "b.jsonl.gz"),              # elsewhere: its name only
    ("banks/b.jsonl.gz", "banks/b.jsonl.gz"),              # relative already
    ("smollm2-135m", "smollm2-135m"),                       # a name
    ("{cwd}", "."),
])
def test_portable_path(tmp_path, given, expected):
    cwd, other = tmp_path / "work", tmp_path / "elsewhere"
    assert portable_path(given.format(cwd=cwd, other=other), cwd) == expected


def test_portable_command_and_policy_path(tmp_path):
    cwd = tmp_path / "work"
    argv = [f"{cwd}/.venv/bin/trace-gym", "bank", "record", "--config", f"{cwd}/configs/b.yaml",
            f"out={tmp_path}/rec/b.jsonl.gz", f"--out={cwd}/b.jsonl.gz", "prompts=8", "env_kwargs={\"a\": 1}"]
    assert portable_command(argv, cwd) == [".venv/bin/trace-gym", "bank", "record", "--config", "configs/b.yaml",
                                           "out=b.jsonl.gz", "--out=b.jsonl.gz", "prompts=8", "env_kwargs={\"a\": 1}"]
    assert shared_policy_path(f"{cwd}/models/q", cwd) == "models/q"
    assert shared_policy_path(str(tmp_path / "cache" / "smollm2-135m"), cwd) is None  # the model cache: not shared
    assert shared_policy_path(None, cwd) is None


def _policy_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    return folder


def test_the_manifest_names_the_policy_by_name_and_checksum_never_by_the_recorders_paths(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cache = _policy_folder(tmp_path / "cache" / "models" / "scripted")  # a model cache outside the working folder
    inside = _policy_folder(work / "models" / "scripted")
    out = tmp_path / "rec" / "b.jsonl.gz"
    kw = dict(engine=ScriptedPolicy(), family=small_family(), prompts=2, roots=2, continuations=1, agent_config=LIMITS)
    command = [f"{work}/.venv/bin/trace-gym", "bank", "record", f"out={out}", f"--policy={cache}"]
    record_bank(str(out), policy="scripted", policy_path=str(cache), command=command, **kw)
    m = open_bank(out).manifest
    assert (m["policy"], m["policy_path"], len(m["weights_sha256"])) == ("scripted", None, 64)
    assert m["command"] == [".venv/bin/trace-gym", "bank", "record", "out=b.jsonl.gz", "--policy=scripted"]
    text = gzip.decompress(out.read_bytes()).decode()
    assert str(tmp_path) not in text  # no absolute path of this machine anywhere in the bank, run lines included
    record_bank(str(work / "b2.jsonl.gz"), policy=str(inside), policy_path=str(inside), command=["x"], **kw)
    m2 = open_bank(work / "b2.jsonl.gz").manifest
    assert (m2["policy"], m2["policy_path"]) == ("models/scripted", "models/scripted")
    assert m2["weights_sha256"] == m["weights_sha256"]  # the same weights, wherever they sat


def test_a_bank_recorded_with_absolute_paths_still_opens_resumes_and_finds_its_policy(tmp_path, monkeypatch):
    from trace_gym.bench.bank import policy_folder

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    folder = _policy_folder(tmp_path / "abs" / "policy")  # outside the working folder
    path = tmp_path / "old.jsonl.gz"
    old = {"policy": str(folder), "policy_path": str(folder), "weights_sha256": None, "roots": 2, "continuations": 1,
           "command": [f"{tmp_path}/.venv/bin/trace-gym", "bank", "record", f"out={path}"]}
    with BankWriter(path, old) as writer:  # as the recorder before this change wrote it, then killed
        writer.start_run(old["command"])
        writer.add(synthetic_record(0, 1, 2, 1) | {"run": 0, "written_at": 0.0})
    assert read_header(path)["manifest"]["policy_path"] == str(folder)
    assert policy_folder(read_header(path)["manifest"]) == str(folder)  # an absolute folder that exists is used
    now = {**old, "policy": "policy", "policy_path": None, "command": ["trace-gym"]}  # the same call, recorded now
    with BankWriter(path, now, resume=True) as writer:
        assert writer.present == {"synth/0"}
        writer.start_run(["trace-gym"])
        writer.add(synthetic_record(1, 1, 2, 1) | {"run": 1, "written_at": 0.0})
        writer.finish()
    bank = open_bank(path)
    assert len(bank) == 2 and bank.manifest["policy_path"] == str(folder)
    runs = [r for r in map(json.loads, gzip.open(path, "rt")) if r["kind"] == "run"]
    assert [r["command"] for r in runs] == [old["command"], ["trace-gym"]]


# ---------------------------------------------------------------------- the recorder's memory
def test_the_prefix_cache_forgets_a_prompt_leaves_first_and_keeps_what_others_build_on():
    import numpy as np
    import torch

    from trace_gym.engines.prefix_cache import PrefixKVCache

    cache = PrefixKVCache(1 << 20)

    def put(tokens):
        seq = np.asarray(tokens, dtype=np.int64)
        cache.put(seq, lambda start: [(torch.zeros(1, len(seq) - start, 2), torch.zeros(1, len(seq) - start, 2))])

    put([1, 2, 3, 4])           # prompt A
    put([1, 2, 3, 4, 5, 6])     # A's completion, built on A's entry
    put([1, 2, 7, 8])           # prompt B shares [1, 2] with A: built on A's entry too
    assert len(cache) == 3
    freed = cache.forget(np.array([1, 2, 3, 4]))
    assert freed > 0 and len(cache) == 2  # A's completion went; A's entry stays: B builds on it
    assert cache.lookup(np.array([1, 2, 3, 4, 5, 6]))[1] == 4 and cache.lookup(np.array([1, 2, 7, 8]))[1] == 4
    cache.forget(np.array([1, 2, 7, 8]))
    cache.forget(np.array([1, 2, 3, 4]))
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_recorder_leaves_no_written_prompt_in_the_engines_cache(tiny_engine, tmp_path):
    from trace_gym.registry import env_family
    from trace_gym.types import SamplingParams

    tiny_engine.reset_prefix_cache()
    cache, seen = tiny_engine.prefix_cache, []

    def say(msg):
        if msg.startswith("prompt "):
            seen.append((len(cache), cache.nbytes))

    record_bank(str(tmp_path / "tiny.jsonl.gz"), engine=tiny_engine, family=env_family("guess_number"), prompts=6,
                roots=3, continuations=1, sampling=SamplingParams(max_tokens=6, temperature=1.0, seed=1),
                agent_config=AgentConfig(max_turn_tokens=6, max_episode_tokens=512, max_turns=3), batch_prompts=2,
                say=say)
    assert len(seen) == 6
    # what stays cached is the prompts in flight at most (2 of them), never every prompt written
    assert max(n for n, _ in seen) <= seen[0][0] * 2 + 2, seen
    assert len(cache) <= 1, seen  # all written: at most an entry another prompt built on
