"""Bank readers trust nothing they read: a bank whose checksum an editor recomputed is still
checked line by line against the documented schema, bounded before it is parsed (line size,
nesting depth, inflated size), and refused in one line naming the file, the line and the
field, with exit status 2 from `bank stats` and `bench --bank`; a recorder killed while
writing the header leaves a file its rerun recovers."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import pytest
from bank_fixtures import ScriptedPolicy, small_family, write_synthetic_bank

from trace_gym import cli
from trace_gym.agent.loop import AgentConfig
from trace_gym.banks import BankError, BankWriter, bank_stats, iter_prompts, open_bank, record_bank
from trace_gym.banks.format import MAX_LINE_BYTES, compress_line, encode_line, iter_members, read_header
from trace_gym.banks.writer import torn_header

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------- a hostile editor
def bank_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in gzip.open(path, "rt")]


def write_lines(path: Path, lines: list, *, raw: dict[int, bytes] | None = None) -> Path:
    """Write ``lines`` as a bank, one gzip member each, with the footer's count and checksum
    recomputed as an editor would (``raw``: line index -> bytes written instead of that line)."""
    raw = raw or {}
    encoded = [raw.get(i) or (json.dumps(obj) + "\n").encode() for i, obj in enumerate(lines)]
    prompts = [e for e, obj in zip(encoded, lines) if obj.get("kind") == "prompt"]
    footer = lines[-1]
    if footer.get("kind") == "footer" and (len(lines) - 1) not in raw:
        footer["sha256"] = hashlib.sha256(b"".join(prompts)).hexdigest()
        encoded[-1] = (json.dumps(footer) + "\n").encode()
    path.write_bytes(b"".join(gzip.compress(e, mtime=0) for e in encoded))
    return path


@pytest.fixture()
def good(tmp_path):
    """A complete synthetic bank: header, run, 3 prompts (R = 4 roots of 3 turns, K = 2), footer."""
    return write_synthetic_bank(tmp_path / "good.jsonl.gz", [1, 2, 3], roots=4, continuations=2)


#: (name, line index (0 header, 1 run, 2.. prompts, -1 footer), mutation, field the error must name)
SCHEMA_CASES = [
    ("no roots", 2, lambda line: line.pop("roots"), "lacks roots"),
    ("no task", 2, lambda line: line.pop("task"), "lacks task"),
    ("task is a list", 2, lambda line: line.update(task=["id", "prompt"]), "task is ["),
    ("root without turns key", 2, lambda line: line["roots"][0].pop("turns"), "roots[0] lacks turns"),
    ("root without success", 2, lambda line: line["roots"][1].pop("success"), "roots[1] lacks success"),
    ("a list where a root belongs", 2, lambda line: line["roots"].__setitem__(0, [1, 2]), "roots[0] is [1, 2]"),
    ("reward NaN", 2, lambda line: line["roots"][0].update(reward=math.nan), "roots[0].reward is nan"),
    ("reward a string", 3, lambda line: line["roots"][2].update(reward="1"), "roots[2].reward is '1'"),
    ("success True with reward 0", 2, lambda line: line["roots"][0].update(reward=0.0, success=True),
     "roots[0].success is True, expected False"),
    ("prefix depth out of range", 2, lambda line: line["roots"][0]["prefixes"][1].update(depth=7),
     "roots[0].prefixes[1].depth is 7"),
    ("prefix depth a string", 2, lambda line: line["roots"][0]["prefixes"][0].update(depth="1"),
     "roots[0].prefixes[0].depth is '1'"),
    ("negative policy_tokens", 2, lambda line: line["roots"][3]["turns"][1].update(policy_tokens=-999_999_999),
     "roots[3].turns[1].policy_tokens is -999999999"),
    ("a bool token count", 4, lambda line: line["roots"][0]["turns"][0].update(env_steps=True),
     "roots[0].turns[0].env_steps is True"),
    ("continuation token count a float", 2,
     lambda line: line["roots"][1]["prefixes"][0]["continuations"][1]["turns"][0].update(prefill_tokens=1.5),
     "roots[1].prefixes[0].continuations[1].turns[0].prefill_tokens is 1.5"),
    ("turn depth off", 2, lambda line: line["roots"][0]["turns"][2].update(depth=9), "roots[0].turns[2].depth is 9"),
    ("observation content a dict", 2,
     lambda line: line["roots"][0]["turns"][0]["observation"][0].update(content={"x": 1}),
     "roots[0].turns[0].observation[0].content"),
    ("fewer roots than R", 2, lambda line: line["roots"].pop(), "roots holds 3 episodes, the manifest says R = 4"),
    ("more continuations than K", 3,
     lambda line: line["roots"][0]["prefixes"][0]["continuations"].append(
         line["roots"][0]["prefixes"][0]["continuations"][0]), "roots[0].prefixes[0].continuations holds 3"),
    ("left_out inconsistent", 2, lambda line: line["roots"][0].update(left_out=[1]), "roots[0].left_out is [1]"),
    ("unknown end", 2, lambda line: line["roots"][0].update(end="won"), "roots[0].end is 'won'"),
    ("manifest without roots", 0, lambda line: line["manifest"].pop("roots"), "manifest lacks roots"),
    ("manifest K negative", 0, lambda line: line["manifest"].update(continuations=-1), "manifest.continuations is -1"),
    ("manifest a list", 0, lambda line: line.update(manifest=[]), "manifest is []"),
    ("run line without started_at", 1, lambda line: line.pop("started_at"), "the run line lacks started_at"),
    ("footer count a string", -1, lambda line: line.update(prompts="3"), "prompts is '3'"),
]


@pytest.mark.parametrize("name, index, mutate, field", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_every_schema_violation_is_one_line_naming_file_line_and_field(good, tmp_path, name, index, mutate,
                                                                       field):
    lines = bank_lines(good)
    mutate(lines[index])
    path = write_lines(tmp_path / "bad.jsonl.gz", lines)
    number = (index % len(lines)) + 1
    for read in (open_bank, lambda p: list(iter_prompts(p)), lambda p: bank_stats(p, verify=False)):
        with pytest.raises(BankError) as caught:
            read(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: line {number}") and field in message and "\n" not in message, message


@pytest.mark.parametrize("name, index, mutate, field", SCHEMA_CASES[:12:3], ids=[c[0] for c in SCHEMA_CASES[:12:3]])
def test_bank_stats_and_bench_bank_exit_2_in_one_line(good, tmp_path, capsys, name, index, mutate, field):
    lines = bank_lines(good)
    mutate(lines[index])
    path = write_lines(tmp_path / "bad.jsonl.gz", lines)
    for argv in (["bank", "stats", str(path), "--predictor", "none"],
                 ["bench", "--bank", str(path), "predictor=constant", "seeds=1", "steps=2", "warmup_steps=1", "candidates=2"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{path}: line {index % len(lines) + 1}" in err and field in err, err


def test_the_cli_in_a_subprocess_has_no_traceback(good, tmp_path):
    lines = bank_lines(good)
    lines[2].pop("roots")  # what ended `bank stats` with KeyError: 'roots'
    bad = write_lines(tmp_path / "bad.jsonl.gz", lines)
    for target in (bad, tmp_path):  # a bad bank, and a directory (IsADirectoryError)
        proc = subprocess.run([sys.executable, "-m", "trace_gym.cli", "bank", "stats", str(target), "--predictor",
                               "none"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1 and str(target) in proc.stderr, proc.stderr


def test_a_directory_is_refused_by_every_reader(tmp_path):
    for read in (open_bank, read_header, lambda p: list(iter_prompts(p)), bank_stats):
        with pytest.raises(BankError, match=rf"{tmp_path} is a directory, not a bank file"):
            read(tmp_path)


# ---------------------------------------------------------------------- bounds before parsing
RAW_CASES = [
    ("nested 100,000 deep", b'{"kind":"prompt","task":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
     "is nested more than 64 levels deep"),
    ("unclosed brackets", b'{"kind":"prompt","task":' + b"{" * 5_000 + b"\n", "is nested more than 64"),
    ("a 5000-digit integer", b'{"kind":"prompt","task":{"id":"x","prompt":"q"},"task_index":' + b"7" * 5000
     + b',"roots":[]}\n', "is not valid JSON (ValueError"),
    ("UTF-16", '{"kind":"prompt"}\n'.encode("utf-16-le"), "line 3"),
    ("not UTF-8", b'{"kind":"prompt","task":"\xff\xfe"}\n', "is not UTF-8"),
]


@pytest.mark.parametrize("name, raw, expected", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_hostile_line_text_is_refused_before_parsing(good, tmp_path, name, raw, expected):
    lines = bank_lines(good)
    path = write_lines(tmp_path / "bad.jsonl.gz", lines, raw={2: raw})
    for read in (open_bank, lambda p: list(iter_prompts(p))):
        with pytest.raises(BankError) as caught:
            read(path)
        message = str(caught.value)
        assert message.startswith(f"{path}: line 3") and expected in message and "\n" not in message, message


def _zero_member(size: int) -> bytes:
    """One gzip member whose text is ``size`` zero bytes (about size / 1000 bytes compressed)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    parts = [c.compress(block) for _ in range(size >> 20)]
    return b"".join(parts) + c.flush()


def test_a_member_that_inflates_past_the_line_bound_stops_there(good, tmp_path):
    size = 8 * MAX_LINE_BYTES  # 256 MiB of text in ~250 KB: the old reader inflated it whole
    bomb = _zero_member(size)
    assert len(bomb) < size // 500
    with open(good, "rb") as f:
        header_end = next(iter_members(f, good))[2]
    for name, content in [("after the header", good.read_bytes()[:header_end] + bomb), ("as the header", bomb)]:
        path = tmp_path / f"bomb-{name.replace(' ', '-')}.jsonl.gz"
        path.write_bytes(content)
        tracemalloc.start()
        try:
            with pytest.raises(BankError, match=rf"{path}: line \d \(the gzip member at byte \d+\) inflates to more "
                                                 "than 33,554,432 bytes"):
                open_bank(path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 3 * MAX_LINE_BYTES, peak  # one line's worth, not the member's 256 MiB
    with pytest.raises(BankError, match="inflates to more than"):
        BankWriter(tmp_path / "bomb-after-the-header.jsonl.gz", bank_lines(good)[0]["manifest"], resume=True)


def test_the_writer_refuses_what_readers_refuse(tmp_path):
    manifest = {"roots": 1, "continuations": 0}
    writer = BankWriter(tmp_path / "w.jsonl.gz", manifest)
    bad = {"task": {"id": "a", "prompt": "q"},
           "roots": [{"error": None, "reward": math.nan, "success": False, "end": "terminated", "seed": 0,
                      "prefixes": [], "left_out": [], "turns": []}]}
    with pytest.raises(BankError, match=r"refused a prompt line: roots\[0\]\.reward is nan"):
        writer.add(bad)
    deep = {"task": {"id": "b", "prompt": "q", "metadata": json.loads("[" * 70 + "]" * 70)},
            "roots": [{"error": "no start", "reward": None, "success": None, "end": "error", "seed": 0,
                       "prefixes": [], "left_out": [], "turns": []}]}
    with pytest.raises(BankError, match="refused to write a line that is nested more than 64"):
        writer.add(deep)
    with pytest.raises(BankError, match="refused to write a bank header: manifest.roots is 0"):
        BankWriter(tmp_path / "x.jsonl.gz", {"roots": 0, "continuations": 1})


def test_a_prompt_read_back_is_the_line_the_scan_checked(good, tmp_path):
    lines = bank_lines(good)
    path = write_lines(tmp_path / "b.jsonl.gz", lines)
    bank = open_bank(path)
    lines[3]["roots"][0]["turns"][0]["policy_tokens"] = -5  # the file changes under the open bank
    write_lines(path, lines)
    assert bank.prompt(0).task_id == "synth/0"  # the same bytes: read back
    with pytest.raises(BankError, match=rf"{path}: line 4 \(prompt 'synth/1'\) changed since the bank was opened"):
        bank.prompt(1)


def test_the_shipped_banks_pass_the_schema():
    for name, prompts in (("math_python_smollm2", 256), ("guess_number_smollm2", 256), ("wiki_qa_smollm2", 128),
                          ("math_python_smollm2_deep", 192)):
        path = ROOT / "trace_gym" / "banks" / "data" / f"{name}.jsonl.gz"
        assert len(open_bank(path)) == prompts


# ---------------------------------------------------------------------- a torn header
def _header_member(manifest: dict) -> bytes:
    return compress_line(encode_line({"kind": "header", "format": "trace_gym.bank", "version": 1,
                                      "manifest": manifest}))


RECORD_KW = dict(prompts=3, roots=2, continuations=1, batch_prompts=2,
                 agent_config=AgentConfig(max_turn_tokens=16, max_episode_tokens=512))


@pytest.mark.parametrize("cut", [0, 3, 10, 24, -1], ids=["empty", "magic only", "gzip header", "some text",
                                                         "all but the last byte"])
def test_a_recorder_killed_while_writing_the_header_is_recovered_by_its_rerun(tmp_path, cut):
    path = tmp_path / "torn.jsonl.gz"
    member = _header_member({"roots": 2, "continuations": 1, "policy": "scripted"})
    path.write_bytes(member[:cut])
    assert torn_header(path) == len(member[:cut])
    messages = []
    out = record_bank(str(path), engine=ScriptedPolicy(), family=small_family(), say=messages.append, **RECORD_KW)
    assert out["complete"] and out["recorded"] == 3 and out["truncated_bytes"] == len(member[:cut])
    assert any("started afresh" in m for m in messages), messages
    assert len(open_bank(path)) == 3


def test_only_a_torn_header_is_started_afresh(tmp_path, good):
    other = tmp_path / "other.jsonl.gz"  # a partial member of some other text: not ours to overwrite
    other.write_bytes(gzip.compress(b'{"kind": "notes", "text": "' + b"x" * 200 + b'"}\n')[:40])
    incomplete = tmp_path / "incomplete.jsonl.gz"  # a whole header: a normal resume
    incomplete.write_bytes(_header_member({"roots": 2, "continuations": 1}))
    assert torn_header(other) is None and torn_header(incomplete) is None and torn_header(good) is None
    with pytest.raises(BankError, match=r"not a bank \(no header line; 40 bytes of a partial first line\)"):
        BankWriter(other, {"roots": 2, "continuations": 1}, resume=True)
    writer = BankWriter(incomplete, {"roots": 2, "continuations": 1}, resume=True)
    assert not writer.torn_header and writer.truncated_bytes == 0 and not writer.complete
