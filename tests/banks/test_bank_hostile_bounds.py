"""Hostile banks a fuzzer built, each small: every one is refused with one BankError naming the
file, the line and the field, or read within a bound (memory, time), never a raw MemoryError,
a UnicodeEncodeError downstream or a hang. Memory bounds are tested on their logic with small
budgets, not by allocating gigabytes."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from pathlib import Path

import pytest

from trace_gym.banks import BankError, bank_stats, list_banks, open_bank
from trace_gym.banks.format import BankPrompt, read_header, scan_bank
from trace_gym.banks.lines import compress_line, encode_line, open_file, parse_line
from trace_gym.utils.textsafe import JSONRefused, loads_record


def turn(d: int) -> dict:
    return dict(depth=d, action="a", observation=[], finish_reason=None, truncation=None, env_error=None,
                cached_tokens=None, policy_tokens=1, observation_tokens=0, context_tokens=1, prefill_tokens=1,
                env_steps=1)


def prompt(i: int, text: str = "p", turns: int = 1, **extra) -> dict:
    return {"kind": "prompt", "task": {"id": f"t{i}", "prompt": text}, **extra,
            "roots": [{"error": None, "reward": 1.0, "success": True, "end": "terminated",
                       "turns": [turn(d) for d in range(1, turns + 1)], "prefixes": [],
                       "left_out": list(range(1, turns))}]}


def write_bank(path: Path, prompts, manifest=None, *, header: dict | None = None,
               raw: dict[int, bytes] | None = None) -> Path:
    """A bank with a valid footer (``raw``: prompt index -> the line bytes written instead)."""
    manifest = manifest or {"roots": 1, "continuations": 0}
    h, lines = hashlib.sha256(), [encode_line(header or {"kind": "header", "format": "trace_gym.bank",
                                                         "version": 1, "manifest": manifest})]
    for n, p in enumerate(prompts):
        line = (raw or {}).get(n) or encode_line(p)
        h.update(line)
        lines.append(line)
    lines.append(encode_line({"kind": "footer", "prompts": len(lines) - 1, "sha256": h.hexdigest()}))
    path.write_bytes(b"".join(map(compress_line, lines)))
    return path


# ---------------------------------------------------------------------- 1. parse memory, the prompt cache
def test_a_line_of_too_many_json_values_is_refused_before_parsing(tmp_path):
    # the fuzzer's line: an unknown key holding 10M empty objects (30 MB, ~0.7 GB parsed); here 50k,
    # against a bound lowered for the test
    from trace_gym.banks import lines

    path = write_bank(tmp_path / "junk.jsonl.gz", [prompt(0, junk=[{}] * 50_000)])
    old = lines.MAX_LINE_VALUES
    lines.MAX_LINE_VALUES = 10_000
    try:
        with pytest.raises(BankError, match=r"junk.jsonl.gz: line 2 .*more than 10,000 JSON values"):
            open_bank(path)
    finally:
        lines.MAX_LINE_VALUES = old


def test_count_values_counts_values_outside_strings():
    from trace_gym.banks.lines import count_values

    # the object, its list, 1, 2, {}, the string (keys not counted)
    assert count_values(b'{"a":[1,2,{}],"b":"x,[{y"}\n') == 6
    assert count_values(b'[{}' + b',{}' * 999 + b']\n') == 1001
    assert count_values(b'"a\\",[[[,"\n') == 1
    assert count_values(b'["s"]') == count_values(b'{"a": 0}') == count_values(b'[[]]') == 2  # not empty
    assert count_values(b'[ 1 , 2 ]\n') == 3


def test_the_parsed_weight_bounds_what_a_line_costs_parsed():
    import json
    import tracemalloc

    from trace_gym.banks.lines import parsed_weight

    for item in ("{}", '{"a":0}', '{"a":{}}', "[0]", "1.5", '"ab"', '{"a":{"b":{"c":[]}}}', "123456789012345678901"):
        line = ('{"x":[' + ",".join([item] * 20_000) + "]}\n").encode()
        tracemalloc.start()
        obj = json.loads(line)
        used = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert used <= parsed_weight(line), item
        del obj


def test_the_prompt_cache_is_bounded_by_bytes_and_keeps_one(tmp_path):
    path = write_bank(tmp_path / "big.jsonl.gz", [prompt(i, "x" * 20_000) for i in range(6)])
    bank = open_bank(path, cache_prompts=1024, cache_bytes=50_000)  # about two of these lines
    for i in range(6):
        bank.prompt(i)
    assert 1 <= len(bank._cache) <= 2
    assert bank._cache_used <= 50_000 or len(bank._cache) == 1
    tiny = open_bank(path, cache_bytes=1)  # a budget under one line still keeps the last one read
    assert tiny.prompt(3) is tiny.prompt(3)
    assert len(tiny._cache) == 1


def test_the_cache_weighs_a_line_by_its_values_not_only_its_bytes(tmp_path):
    many = prompt(0, extra=[0] * 5_000)  # 10 KB of text, 5k values: weighs far more than 10 KB
    path = write_bank(tmp_path / "vals.jsonl.gz", [many, prompt(1, extra=[0] * 5_000)])
    bank = open_bank(path, cache_bytes=200_000)
    bank.prompt(0)
    bank.prompt(1)
    assert len(bank._cache) == 1


# ---------------------------------------------------------------------- 2. the scan's index
def test_the_scan_index_keeps_no_prompt_text(tmp_path):
    path = write_bank(tmp_path / "long.jsonl.gz", [prompt(i, "y" * 100_000) for i in range(3)])
    scan = scan_bank(path)
    assert not hasattr(scan.prompts[0], "prompt")
    assert open_bank(path).prompt(1).prompt == "y" * 100_000  # read back from the file when asked


def test_a_task_id_longer_than_the_bound_is_refused(tmp_path):
    p = prompt(0)
    p["task"]["id"] = "i" * 5_000
    with pytest.raises(BankError, match=r"line 2: task.id .*at most 1024 characters"):
        open_bank(write_bank(tmp_path / "id.jsonl.gz", [p]))


def test_memory_error_in_loads_record_says_too_large_not_invalid(monkeypatch):
    import json

    def boom(data):
        raise MemoryError

    monkeypatch.setattr(json, "loads", boom)
    with pytest.raises(JSONRefused, match="too large to parse") as err:
        loads_record(b'{"a": 1}\n')
    assert "not valid JSON" not in str(err.value)


# ---------------------------------------------------------------------- 3. stats on a huge R
@pytest.mark.parametrize("key", ["roots", "continuations"])
def test_a_manifest_count_past_its_bound_is_refused(tmp_path, key):
    manifest = {"roots": 1, "continuations": 0, key: 2**53}
    path = write_bank(tmp_path / "huge.jsonl.gz", [], manifest)
    with pytest.raises(BankError, match=rf"huge.jsonl.gz: line 1: manifest.{key} is 9007199254740992"):
        read_header(path)


def test_mixed_by_group_size_stops_at_the_largest_group_present():
    from trace_gym.banks.stats import MAX_GROUP, _mixed_by_group_size

    t = time.perf_counter()
    out = _mixed_by_group_size([(1, 3), (2, 4)], 2**53)
    assert time.perf_counter() - t < 1.0
    assert list(out) == ["2", "3", "4"]
    wide = _mixed_by_group_size([(500, 1000)] * 3, 1000)
    assert len(wide) == MAX_GROUP - 1


def test_bank_stats_returns_on_the_largest_allowed_r(tmp_path):
    from trace_gym.banks.schema import MAX_ROOTS

    path = write_bank(tmp_path / "r.jsonl.gz", [], {"roots": MAX_ROOTS, "continuations": 0})
    t = time.perf_counter()
    assert bank_stats(path)["mixed_by_group_size"] == {}
    assert time.perf_counter() - t < 2.0


# ---------------------------------------------------------------------- 4. lone surrogates
@pytest.mark.parametrize("field, old, new", [
    ("task.prompt", b'"prompt":"p"', b'"prompt":"p\\ud800"'),
    ("task.id", b'"id":"t0"', b'"id":"t0\\uDC00"'),
    ("roots[0].turns[0].action", b'"action":"a"', b'"action":"a\\udbff"'),
    ("roots[0].turns[0].observation[0].content", b'"content":"c"', b'"content":"\\ud800c"'),
    ("roots[0].turns[0].observation[0].role", b'"role":"user"', b'"role":"\\udfff"'),
])
def test_a_lone_surrogate_in_a_text_field_is_refused_naming_it(tmp_path, field, old, new):
    p = prompt(0)
    p["roots"][0]["turns"][0]["observation"] = [{"role": "user", "content": "c"}]
    line = encode_line(p)
    assert old in line
    path = write_bank(tmp_path / "sur.jsonl.gz", [p], raw={0: line.replace(old, new)})
    with pytest.raises(BankError, match=r"sur.jsonl.gz: line 2: " + re.escape(field) + " holds a lone surrogate"):
        open_bank(path)


def test_a_surrogate_pair_escape_is_read(tmp_path):
    p = prompt(0)
    path = write_bank(tmp_path / "pair.jsonl.gz", [p],
                      raw={0: encode_line(p).replace(b'"prompt":"p"', b'"prompt":"\\ud83d\\ude00"')})
    assert open_bank(path).prompt(0).prompt == "\U0001F600"


# ---------------------------------------------------------------------- 5. turns per root
def test_more_turns_than_the_manifests_max_turns_are_refused(tmp_path):
    manifest = {"roots": 1, "continuations": 0, "agent": {"max_turns": 4}}
    path = write_bank(tmp_path / "t.jsonl.gz", [prompt(0, turns=5)], manifest)
    with pytest.raises(BankError, match=r"line 2: roots\[0\].turns holds 5 turns, more than .*max_turns = 4"):
        open_bank(path)
    assert len(open_bank(write_bank(tmp_path / "ok.jsonl.gz", [prompt(0, turns=4)], manifest))) == 1


def test_more_turns_than_max_turns_are_refused_without_an_agent(tmp_path):
    from trace_gym.banks.schema import MAX_TURNS

    path = write_bank(tmp_path / "t.jsonl.gz", [prompt(0, turns=MAX_TURNS + 1)])
    with pytest.raises(BankError, match=rf"roots\[0\].turns holds {MAX_TURNS + 1} turns, more than {MAX_TURNS}"):
        open_bank(path)


def test_a_manifest_max_turns_past_the_bound_is_refused(tmp_path):
    from trace_gym.banks.schema import MAX_TURNS

    path = write_bank(tmp_path / "m.jsonl.gz", [], {"roots": 1, "continuations": 0, "agent": {"max_turns": 10**9}})
    with pytest.raises(BankError,
                       match=rf"manifest.agent.max_turns is 1000000000, expected an integer in 1..{MAX_TURNS}"):
        read_header(path)


def test_a_continuation_past_max_turns_is_refused(tmp_path):
    manifest = {"roots": 1, "continuations": 1, "agent": {"max_turns": 3}}
    p = prompt(0, turns=2)
    p["roots"][0]["left_out"] = []
    p["roots"][0]["prefixes"] = [{"depth": 1, "continuations": [
        {"error": None, "reward": 0.0, "success": False, "end": "terminated", "turns": [turn(2), turn(3), turn(4)]}]}]
    with pytest.raises(BankError, match=r"continuations\[0\].turns .*more than .*max_turns = 3"):
        open_bank(write_bank(tmp_path / "c.jsonl.gz", [p], manifest))


def test_prefix_lookup_is_by_depth():
    prefixes = [{"depth": d, "continuations": []} for d in range(1, 200)]
    record = BankPrompt(0, {"task": {"id": "t", "prompt": "p"}, "roots": [{"prefixes": prefixes}]})
    assert record.prefix(0, 150) is prefixes[149] and record.prefix(0, 500) is None
    assert record._prefixes[0][150] is prefixes[149]  # one dict per root, built once


# ---------------------------------------------------------------------- 6. a FIFO
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_and_listing_skips_it(tmp_path):
    fifo = tmp_path / "pipe.jsonl.gz"
    os.mkfifo(fifo)
    write_bank(tmp_path / "ok.jsonl.gz", [prompt(0)])
    result: dict = {}

    def run():
        try:
            open_file(fifo)
        except BankError as exc:
            result["error"] = str(exc)
        result["rows"] = [Path(r["path"]).name for r in list_banks(tmp_path)]

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the old code's open() so the test ends
        with open(fifo, "wb"):
            pass
        worker.join(5)
        pytest.fail("opening a FIFO hung")
    assert "not a regular file" in result["error"] and "pipe.jsonl.gz" in result["error"]
    assert result["rows"] == ["ok.jsonl.gz"]


# ---------------------------------------------------------------------- 7. version and seed types
@pytest.mark.parametrize("version", [True, 1.0])
def test_a_version_that_is_not_the_integer_1_is_refused(tmp_path, version):
    header = {"kind": "header", "format": "trace_gym.bank", "version": version,
              "manifest": {"roots": 1, "continuations": 0}}
    with pytest.raises(BankError, match="bank format version"):
        read_header(write_bank(tmp_path / "v.jsonl.gz", [], header=header))


@pytest.mark.parametrize("seed", [1.5, True, 2**60])
def test_a_root_seed_that_is_not_an_integer_is_refused(tmp_path, seed):
    p = prompt(0)
    p["roots"][0]["seed"] = seed
    with pytest.raises(BankError, match=r"line 2: roots\[0\].seed is .*expected an integer"):
        open_bank(write_bank(tmp_path / "s.jsonl.gz", [p]))


def test_a_negative_integer_seed_is_read(tmp_path):
    p = prompt(0)
    p["roots"][0]["seed"] = -3  # env_seed(base, p, j) with a negative base seed
    assert open_bank(write_bank(tmp_path / "s.jsonl.gz", [p])).prompt(0).roots[0]["seed"] == -3


def test_parse_line_still_names_the_line(tmp_path):
    with pytest.raises(BankError, match="x.gz: line 3"):
        parse_line(b"[1,\n", tmp_path / "x.gz", 3, 0)


def test_the_writer_refuses_a_lone_surrogate_and_a_fifo(tmp_path):
    from trace_gym.banks import BankWriter

    writer = BankWriter(tmp_path / "w.jsonl.gz", {"roots": 1, "continuations": 0})
    record = prompt(0, "p\ud800")
    record.pop("kind")
    with pytest.raises(BankError, match=r"refused a prompt line: task.prompt holds a lone surrogate"):
        writer.add(record)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.jsonl.gz")
        with pytest.raises(BankError, match="not a regular file"):
            BankWriter(tmp_path / "pipe.jsonl.gz", {"roots": 1, "continuations": 0}, resume=True)
