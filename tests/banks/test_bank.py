"""Rollout banks: the format (streaming, checksum), the recorder (resumable, the agent loop of
training), the replay (exact, without replacement, refusing what was not recorded), the bank
bench (same tables and checks as the others, no verdict when the bank runs out) and the stats."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from bank_fixtures import ScriptedPolicy, small_family, synthetic_record, write_synthetic_bank

from trace_gym.bench.report import format_bench
from trace_gym.bench import loop as bench
from trace_gym.agent.loop import AgentConfig, AgentRunner
from trace_gym.banks import (EXHAUSTED, BankBranchRunner, BankDraws, BankError, BankTree, BankWriter, bank_stats,
                             close_recording, format_bank_stats, iter_prompts, list_banks, mixed_without_replacement, open_bank,
                             record_bank)
from trace_gym.banks.record import prefix_depths
from trace_gym.banks.writer import lock_bank, lock_path
from trace_gym.runs.files import release_lock
from trace_gym.bench.bank import run_bank_bench
from trace_gym.bench.config import BankBenchConfig
from trace_gym.budget import BudgetLedger
from trace_gym.agent.rollout import AgentBranchRunner, node_context
from trace_gym.strategies import shaped_strategies
from trace_gym.tree import ROOT
from trace_gym.types import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def strategies_for(cfg, names=()):
    return shaped_strategies(names or cfg.strategies, group_size=cfg.group_size,
                             continuations_per_root=cfg.continuations_per_root)


def bench_on(path, **kw):
    cfg = BankBenchConfig(bank=str(path), **{"predictor": "constant", "oracle_upper_bound": False,
                                             "warmup_prompts": 0, **kw})
    return run_bank_bench(cfg, strategies_for(cfg))


# ---------------------------------------------------------------------- the closed form
def test_mixed_without_replacement_against_brute_force():
    for recorded in range(1, 7):
        for s in range(recorded + 1):
            outcomes = [1] * s + [0] * (recorded - s)
            for g in range(1, recorded + 1):
                groups = list(itertools.combinations(outcomes, g))
                brute = sum(0 < sum(grp) < g for grp in groups) / len(groups)
                assert mixed_without_replacement(s, recorded, g) == pytest.approx(brute)
    with pytest.raises(ValueError, match="1 <= group <= recorded"):
        mixed_without_replacement(1, 4, 5)


# ---------------------------------------------------------------------- replay is exact
def test_uniform_replay_matches_the_hypergeometric_closed_form(tmp_path):
    successes = np.random.default_rng(3).integers(0, 9, size=40)
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", successes, roots=8, continuations=2)
    # 10 of 20 random candidates per step get G = 4 of the 8 recorded roots: each chosen prompt is a
    # uniformly random one of the bank, so E[effective ratio] is the mean hypergeometric P(mixed)
    # (150 seeds x 2 steps x 10 prompts: as many draws as 300 seeds of 5 prompts, half the steps)
    res = bench_on(path, seeds=150, steps=2, warmup_steps=0, candidates=20, root_budget=40, group_size=4,
                   continuations_per_root=0, strategies=("uniform",))
    expected = np.mean([mixed_without_replacement(int(s), 8, 4) for s in successes])
    u = res["strategies"]["uniform"]
    assert u["exhausted_share"] == 0 and u["rollouts_per_prompt"] == 4
    assert abs(u["effective_ratio"] - expected) <= u["effective_ratio_ci"], (u["effective_ratio"], expected)
    assert u["effective_ratio_ci"] < 0.02  # a tight interval: the test can tell a wrong replay apart
    # every prompt chosen with all its recorded roots: the effective ratio is the bank's mixed share, exactly
    full = bench_on(path, seeds=2, steps=1, warmup_steps=0, candidates=40, root_budget=320, group_size=8,
                    continuations_per_root=0, strategies=("uniform",))["strategies"]["uniform"]
    assert full["effective_ratio"] == pytest.approx(np.mean((successes > 0) & (successes < 8)))
    assert full["effective_ratio_ci"] == pytest.approx(0.0, abs=1e-12)


def test_replayed_trees_hold_recorded_outcomes_drawn_without_replacement(tmp_path):
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", [3, 1], roots=4, continuations=2)
    record = open_bank(path).prompt(0)
    runner, ledger = BankBranchRunner(BankDraws(seed=7)), BudgetLedger()
    tree = runner.new_tree(0, record)
    runner.start_roots(0, 3, ledger)
    runner.start_roots(0, 3, ledger)  # a fallback asking again: only 1 unused root is left
    results = runner.advance(ledger)
    drawn = [tree.nodes[r.leaf].info["bank"]["root"] for r in results if r.leaf is not None]
    assert sorted(drawn) == [0, 1, 2, 3]  # each recorded root once
    assert [r.error for r in results].count(EXHAUSTED) == 2 and ledger.exhausted == 2
    assert all(r.leaf is None for r in results if r.error == EXHAUSTED)
    assert [tree.nodes[r.leaf].reward for r in results if r.leaf is not None] == [
        record.roots[j]["reward"] for j in drawn]
    # exact costs are the recorded ones: tokens of every turn, the shared first prefill once per call
    roots = record.roots
    assert ledger.generated_tokens == sum(t["policy_tokens"] for r in roots for t in r["turns"])
    assert ledger.env_steps == sum(len(r["turns"]) for r in roots)
    node = tree.expansion_candidates()[0][0]
    runner.start_continuations(0, node, 3, ledger)  # K = 2 recorded there
    conts = runner.advance(ledger)
    assert [r.error for r in conts].count(EXHAUSTED) == 1 and ledger.exhausted == 3
    assert runner.draws.roots_needed == 6 and runner.draws.continuations_needed == 3
    # another arm with the same seed draws the same rollouts (common random numbers)
    twin = BankBranchRunner(BankDraws(seed=7))
    twin_tree = twin.new_tree(0, record)
    twin.start_roots(0, 3, BudgetLedger())
    assert [twin_tree.nodes[r.leaf].info["bank"]["root"] for r in twin.advance(BudgetLedger())] == drawn[:3]


def test_beyond_what_was_recorded_is_exhausted_and_there_is_no_verdict(tmp_path):
    successes = np.random.default_rng(1).integers(0, 5, size=24)
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", successes, roots=4, continuations=1)
    res = bench_on(path, seeds=3, steps=2, warmup_steps=0, candidates=12, root_budget=16, group_size=8,
                   continuations_per_root=3, strategies=("uniform", "trace"), oracle_upper_bound=True)
    s = res["strategies"]
    assert s["uniform"]["exhausted_share"] == pytest.approx(0.5)  # 8 asked, 4 recorded, per prompt
    assert s["trace"]["exhausted_share"] > 0.01  # 3 continuations per root asked of prefixes with 1
    assert max(row["roots_needed"] for row in s["uniform"]["per_rep"]) == 8
    assert max(row["continuations_needed"] for row in s["trace"]["per_rep"]) > 1
    guard, *rest = res["checks"]
    assert guard.status == "FAIL" and "NO VERDICT" in guard.detail
    assert "at least 8 roots per prompt" in guard.detail and "R = 4" in guard.detail
    verdicts = [c for c in rest if c.name.startswith("trace") and not c.detail.startswith("needs")]
    assert verdicts and all(c.status == "SKIP" and "no verdict" in c.detail for c in verdicts)
    printed = format_bench(res)
    assert "NO VERDICT" in printed and "rollout bank" in printed and "exhausted" in printed
    # a bank big enough for the same bench passes the guard
    big = write_synthetic_bank(tmp_path / "big.jsonl.gz", successes, roots=16, continuations=8)
    ok = bench_on(big, seeds=2, steps=2, warmup_steps=0, candidates=12, root_budget=16, group_size=8,
                  continuations_per_root=3, strategies=("uniform", "trace"))
    assert ok["checks"][0].status == "PASS"


def test_replay_leaves_are_a_subset_of_the_recording(tmp_path):
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", [2, 2, 1, 3], roots=4, continuations=1)
    bank = open_bank(path)
    from trace_gym.step.driver import run_step

    strategy = shaped_strategies(("trace",), group_size=4, continuations_per_root=6)["trace"]
    from trace_gym.predictor.kinds import ConstantPredictor

    step = run_step([bank.prompt(i) for i in range(4)], strategy, ConstantPredictor(0.5),
                    BankBranchRunner(BankDraws(0)), 16, np.random.default_rng(0))
    assert step.ledger.exhausted > 0
    for tree, i in zip(step.trees, step.tree_candidates):
        record = bank.prompt(int(i))
        recorded = len(record.roots) + sum(len(p["continuations"]) for r in record.roots for p in r["prefixes"])
        used = [(n.info["bank"]["root"], n.info["bank"].get("prefix"), n.info["bank"].get("continuation"))
                for n in tree.leaves()]
        assert len(used) == len(set(used)) <= recorded  # each recorded rollout at most once
        for leaf, (j, t, c) in zip(tree.leaves(), used):
            ep = record.roots[j] if t is None else record.prefix(j, t)["continuations"][c]
            assert leaf.reward == ep["reward"]


# ---------------------------------------------------------------------- same contexts as live trees
@pytest.mark.parametrize("env", ["guess_number", "math_python"])
def test_replayed_node_contexts_and_costs_equal_the_live_trees(tmp_path, env):
    from trace_gym.registry import env_family

    # math_python restores by replaying cells: the replayed env steps are recorded and charged too
    family, engine = (small_family(), ScriptedPolicy()) if env == "guess_number" else (
        env_family("math_python"), ScriptedPolicy(style="code"))
    sampling = SamplingParams(max_tokens=64, temperature=1.0, seed=0)
    limits = AgentConfig(max_turn_tokens=64, max_episode_tokens=2048, max_turns=4)
    path = tmp_path / "live.jsonl.gz"
    record_bank(str(path), engine=engine, family=family, prompts=2, roots=3, continuations=2, sampling=sampling,
                agent_config=limits, policy="scripted")
    bank = open_bank(path)
    tasks = family.load_tasks(2, seed=0)
    agent = AgentRunner(engine, engine.tokenizer, family.make_env, sampling, limits)
    replayed = 0
    try:
        for i in range(len(bank)):
            record = bank.prompt(i)
            p = record.data["task_index"]
            live, live_ledger = AgentBranchRunner(agent, seed=0), BudgetLedger()
            live_tree = live.new_tree(p, tasks[p])
            replay, replay_ledger = BankBranchRunner(BankDraws(seed=11)), BudgetLedger()
            replay_tree = replay.new_tree(p, record)
            for runner, led, tree in ((live, live_ledger, live_tree), (replay, replay_ledger, replay_tree)):
                runner.start_roots(p, 3, led)  # every root, then every prefix with 2 continuations
                while runner.live:
                    runner.advance(led)
                for node, _ in tree.expansion_candidates():
                    runner.start_continuations(p, node, 2, led)
                while runner.live:
                    runner.advance(led)
            assert len(replay_tree) == len(live_tree) > 1

            def contexts(runner, tree):
                out = sorted((c.depth, c.history) for c in (runner.node_context(p, n.id) for n in tree.nodes))
                assert all(runner.node_context(p, n.id) == node_context(tree, n.id, tasks[p].prompt)
                           for n in tree.nodes)
                return out

            assert contexts(replay, replay_tree) == contexts(live, live_tree)
            assert replay.prompt_context(record) == live.prompt_context(tasks[p])
            assert sorted(n.reward for n in replay_tree.leaves()) == sorted(n.reward for n in live_tree.leaves())
            for unit in ("generated_tokens", "prefill_tokens", "env_steps", "replayed_env_steps", "errors"):
                assert getattr(replay_ledger, unit) == getattr(live_ledger, unit), unit
            replayed += replay_ledger.replayed_env_steps
    finally:
        agent.close()
    assert (replayed > 0) == (env == "math_python")


# ---------------------------------------------------------------------- the recorder
def test_record_with_the_tiny_model_end_to_end(tiny_engine, tiny_model_path, tmp_path):
    from trace_gym.registry import env_family

    family = env_family("guess_number")
    path = tmp_path / "tiny.jsonl.gz"
    lines = []
    out = record_bank(str(path), engine=tiny_engine, family=family, prompts=2, roots=2, continuations=1,
                      sampling=SamplingParams(max_tokens=6, temperature=1.0, seed=1),
                      agent_config=AgentConfig(max_turn_tokens=6, max_episode_tokens=512, max_turns=3),
                      policy="tiny", policy_path=str(tiny_model_path), command=["trace-gym", "bank", "record"],
                      say=lines.append)
    assert out["complete"] and out["recorded"] == 2 and len(lines) == 3
    bank = open_bank(path)
    m = bank.manifest
    assert (m["roots"], m["continuations"], m["env_id"], m["policy"]) == (2, 1, "trace_gym/GuessNumber-v0", "tiny")
    assert len(m["weights_sha256"]) == 64 and m["command"] == ["trace-gym", "bank", "record"]
    for i in range(len(bank)):
        record = bank.prompt(i)
        assert len(record.roots) == 2
        for root in record.roots:
            assert root["turns"] and all(t["policy_tokens"] > 0 and t["prefill_tokens"] > 0 for t in root["turns"])
            assert [p["depth"] for p in root["prefixes"]] == list(range(1, len(root["turns"])))
            assert all(len(p["continuations"]) == 1 for p in root["prefixes"])
            assert root["reward"] is not None and root["end"] in ("terminated", "truncated", "max_turns")
    assert sorted(e.task_id for e in bank.entries) == ["guess/0", "guess/1"]


class CountingPolicy(ScriptedPolicy):
    """The scripted engine, counting the rows of each generate call (one call = one round)."""

    def __init__(self):
        super().__init__()
        self.rounds: list[int] = []

    def generate(self, prefixes, n, sampling):
        self.rounds.append(sum(n))
        return super().generate(prefixes, n, sampling)


def test_the_rolling_schedule_records_the_same_prompts_in_fewer_wider_rounds(tmp_path):
    """A prompt starts the moment another is written: the same records (the scripted engine
    answers by prefix), in fewer generation rounds than waiting for each batch's last prompt."""
    kw = dict(family=small_family(), prompts=7, roots=2, continuations=1, batch_prompts=3,
              agent_config=AgentConfig(max_turn_tokens=16, max_episode_tokens=512))
    records, rounds, lines = {}, {}, []
    for schedule in ("batches", "rolling"):
        engine = CountingPolicy()
        out = record_bank(str(tmp_path / f"{schedule}.jsonl.gz"), engine=engine, schedule=schedule,
                          say=lines.append, **kw)
        assert out["complete"] and out["recorded"] == 7 and out["prompts_per_minute"] > 0
        bank = open_bank(tmp_path / f"{schedule}.jsonl.gz")
        records[schedule] = {e.task_id: bank.prompt(i).roots for i, e in enumerate(bank.entries)}
        rounds[schedule] = engine.rounds
    assert records["rolling"] == records["batches"] and len(records["rolling"]) == 7
    assert len(rounds["rolling"]) < len(rounds["batches"]), rounds
    assert sum(rounds["rolling"]) == sum(rounds["batches"])  # the same episodes, packed tighter
    assert all(re.search(r"^prompt \d/7 written: guess/\d; [\d.]+ prompts/min, ETA [\d.]+ (min|h)$", m)
               for m in lines if m.startswith("prompt ")), lines
    with pytest.raises(ValueError, match="schedule must be"):
        record_bank(str(tmp_path / "x.jsonl.gz"), engine=CountingPolicy(), schedule="serial", **kw)


RECORD_AND_DIE = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from bank_fixtures import ScriptedPolicy, small_family
    from trace_gym.agent.loop import AgentConfig
    from trace_gym.banks import record_bank

    def say(msg):
        if msg.startswith("prompt 2/"):  # killed right after its second prompt is durable
            os.kill(os.getpid(), signal.SIGKILL)

    record_bank({path!r}, engine=ScriptedPolicy(), family=small_family(), prompts=8, roots=3, continuations=2,
                agent_config=AgentConfig(max_turn_tokens=16, max_episode_tokens=512), batch_prompts=3, say=say)
""")


def test_a_killed_recording_resumes_with_every_prompt_exactly_once(tmp_path):
    path = tmp_path / "resume.jsonl.gz"
    script = RECORD_AND_DIE.format(tests=str(FIXTURES), path=str(path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -9, proc.stderr[-2000:]
    with pytest.raises(BankError, match=r"incomplete bank \(2 prompts, no footer\).*rerun"):
        open_bank(path)
    first = [json.loads(line) for line in gzip.open(path, "rt")]
    assert [r["kind"] for r in first] == ["header", "run", "prompt", "prompt"]
    with open(path, "ab") as f:  # and as if killed in the middle of writing a third line
        f.write(gzip.compress(b'{"kind": "prompt", "task": {"id": "half"}}\n')[:17])
    lines = []
    kw = dict(engine=ScriptedPolicy(), family=small_family(), prompts=8, roots=3, continuations=2,
              agent_config=AgentConfig(max_turn_tokens=16, max_episode_tokens=512), batch_prompts=3)
    out = record_bank(str(path), say=lines.append, **kw)
    assert out["skipped"] == 2 and out["recorded"] == 6 and out["truncated_bytes"] == 17 and out["complete"]
    assert any("cut 17 bytes" in m for m in lines) and any("resuming, 2 prompts already recorded" in m for m in lines)
    bank = open_bank(path)  # the checksum covers both runs' prompts
    ids = [e.task_id for e in bank.entries]
    assert sorted(ids) == sorted(f"guess/{i}" for i in range(8)) and len(set(ids)) == 8
    assert [e.run for e in bank.entries] == [0, 0, 1, 1, 1, 1, 1, 1]
    assert [e.task_id for e in bank.entries[:2]] == [r["task"]["id"] for r in first[2:]]
    assert bank.scan.footer["runs"] == 2
    assert record_bank(str(path), **kw)["recorded"] == 0  # complete: nothing to do
    with pytest.raises(BankError, match="other settings.*roots: file 3, now 4"):
        record_bank(str(path), **{**kw, "roots": 4})


def test_a_resume_cuts_a_damaged_tail_and_keeps_what_came_before(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    writer = BankWriter(path, {"roots": 2, "continuations": 1})
    writer.start_run()
    writer.add(synthetic_record(0, 1, 2, 1))
    writer.close()  # as a killed recorder's lock is let go
    with open(path, "ab") as f:  # a line the disk lost: its header arrived, its data did not
        f.write(b"\x1f\x8b\x08\x00" + bytes(60))
    with pytest.raises(BankError, match="corrupt gzip data in the member at byte"):
        open_bank(path)
    resumed = BankWriter(path, {"roots": 2, "continuations": 1}, resume=True)
    assert resumed.truncated_bytes == 64 and resumed.present == {"synth/0"}
    resumed.start_run()
    resumed.add(synthetic_record(1, 1, 2, 1))
    resumed.finish()
    assert [e.task_id for e in open_bank(path).entries] == ["synth/0", "synth/1"]


# ---------------------------------------------------------------------- the format
def test_close_ends_an_interrupted_recording_at_the_prompts_it_holds(tmp_path):
    path = tmp_path / "short.jsonl.gz"
    writer = BankWriter(path, {"roots": 2, "continuations": 1, "prompts": 5})
    writer.start_run()
    for i in range(2):  # as the recorder writes them: each line says when
        writer.add(synthetic_record(i, 1, 2, 1) | {"written_at": time.time()})
    writer.close()  # a recording stopped after 2 of 5 prompts
    with open(path, "ab") as f:  # killed while it wrote a third
        f.write(gzip.compress(b'{"kind": "prompt", "task": {"id": "half"}}\n')[:17])
    holder = lock_bank(path)  # a recorder still running: refused, named, nothing touched
    size = path.stat().st_size
    with pytest.raises(ValueError, match=f"in use by pid {os.getpid()}"):
        close_recording(path)
    assert path.stat().st_size == size
    release_lock(holder, lock_path(path), remove=True)
    time.sleep(0.5)  # closed a while after the recording stopped: that while is not recording time
    footer = close_recording(path)
    assert (footer["prompts"], footer["tasks"], footer["closed_early"], footer["runs"]) == (2, 5, True, 1)
    lines = [json.loads(line) for line in gzip.open(path, "rt")]
    run, last = lines[1], [r for r in lines if r["kind"] == "prompt"][-1]
    assert footer["seconds"] == pytest.approx(last["written_at"] - run["started_at"]) and footer["seconds"] < 0.5
    bank = open_bank(path)  # verified: checksum and count; the torn line was cut
    assert [e.task_id for e in bank.entries] == [synthetic_record(i, 1, 2, 1)["task"]["id"] for i in (0, 1)]
    row = next(r for r in list_banks(tmp_path) if r["path"] == str(path))
    assert (row["prompts"], row["planned"], row["complete"]) == (2, 5, True)
    with pytest.raises(BankError, match="already complete \\(2 prompts\\)"):
        close_recording(path)
    with pytest.raises(BankError, match="is complete; nothing to record"):
        BankWriter(path, {"roots": 2, "continuations": 1, "prompts": 5}, resume=True).start_run()
    full = tmp_path / "full.jsonl.gz"  # every planned prompt in, the footer lost: a rerun of the recorder finishes it
    writer = BankWriter(full, {"roots": 2, "continuations": 1, "prompts": 1})
    writer.start_run()
    writer.add(synthetic_record(0, 1, 2, 1))
    writer.close()
    with pytest.raises(BankError, match="holds all 1 planned prompts; rerun"):
        close_recording(full)
    empty = tmp_path / "empty.jsonl.gz"
    BankWriter(empty, {"roots": 2, "continuations": 1}).close()
    with pytest.raises(BankError, match="holds no prompt yet"):
        close_recording(empty)


def test_streaming_reader_random_access_and_listing(tmp_path):
    path = write_synthetic_bank(tmp_path / "s.jsonl.gz", [0, 1, 2, 3, 4], roots=4, continuations=1)
    stream = iter_prompts(path)
    first = next(stream)  # a generator: the first prompt comes before the rest is read
    assert first.task_id == "synth/0"
    rest = list(stream)
    bank = open_bank(path, cache_prompts=2)
    assert [r.data for r in [first, *rest]] == [bank.prompt(i).data for i in range(5)]
    assert [r.prompt_rate() for r in [first, *rest]] == [0, 0.25, 0.5, 0.75, 1]
    assert [line["kind"] for line in map(json.loads, gzip.open(path, "rt"))][-1] == "footer"  # zcat reads it
    (tmp_path / "other.jsonl.gz").write_bytes(gzip.compress(b'{"x": 1}\n'))
    rows = list_banks(tmp_path)
    assert [(Path(r["path"]).name, r["prompts"], r["roots"], r["complete"]) for r in rows] == [
        ("s.jsonl.gz", 5, 4, True)]


def test_a_tampered_bank_is_refused_with_its_name(tmp_path):
    path = write_synthetic_bank(tmp_path / "t.jsonl.gz", [1, 2, 3], roots=4, continuations=1)
    lines = [json.loads(line) for line in gzip.open(path, "rt")]
    lines[3]["roots"][0]["reward"] = 1.0 - lines[3]["roots"][0]["reward"]  # flip one recorded outcome,
    lines[3]["roots"][0]["success"] = not lines[3]["roots"][0]["success"]  # consistently (else the schema refuses it)
    with open(path, "wb") as f:
        for line in lines:
            f.write(gzip.compress((json.dumps(line) + "\n").encode()))
    with pytest.raises(BankError, match=rf"{path}: checksum mismatch"):
        open_bank(path)
    with pytest.raises(BankError, match="checksum mismatch"):
        list(iter_prompts(path))
    assert len(open_bank(path, verify=False)) == 3  # readable on purpose
    (tmp_path / "x.jsonl.gz").write_bytes(gzip.compress(b'{"kind": "prompt"}\n'))
    with pytest.raises(BankError, match="x.jsonl.gz: not a bank"):
        open_bank(tmp_path / "x.jsonl.gz")
    with pytest.raises(BankError, match="exists; pass resume=True"):
        BankWriter(path, {})
    writer = BankWriter(tmp_path / "w.jsonl.gz", {"roots": 2, "continuations": 0})
    with pytest.raises(BankError, match="lacks reward"):
        writer.add({"task": {"id": "a", "prompt": "q"}, "roots": [{"error": None, "turns": []}]})
    good = synthetic_record(0, 1, 2, 0)
    writer.add(good)
    with pytest.raises(BankError, match="already holds prompt 'synth/0'"):
        writer.add(good)


# ---------------------------------------------------------------------- the bench and the stats
def test_bank_bench_every_predictor_kind_oracle_and_token_mode(tmp_path):
    successes = np.random.default_rng(5).integers(0, 9, size=32)
    path = write_synthetic_bank(tmp_path / "b.jsonl.gz", successes, roots=8, continuations=4, turns=4, cap=2)
    res = bench_on(path, seeds=2, steps=2, warmup_steps=1, candidates=16, root_budget=8, group_size=4,
                   predictor="embedding", oracle_upper_bound=True, strategies=("uniform", "trace"))
    s = res["strategies"]
    oracle = s["trace" + bench.UPPER_BOUND]
    assert oracle["upper_bound"] and oracle["prompt_spearman"] == pytest.approx(1.0)
    assert s["trace"]["predictor"] == "embedding" and math.isfinite(s["trace"]["prompt_spearman"])
    assert all(v["left_out_prefixes"] > 0 for v in s.values())  # depth 3 of every root was left out
    assert "1" in s["trace"]["per_rep"][0]["prefix_spearman_by_depth"]
    printed = format_bench(res)
    assert "by prefix depth" in printed and "upper bound" in printed and "left-out prefixes" in printed
    tokens = bench_on(path, seeds=2, steps=2, warmup_steps=0, candidates=16, root_budget=8, group_size=4,
                      budget_unit="tokens", strategies=("uniform", "trace"))
    check = next(c for c in tokens["checks"] if c.name.startswith("equal generated tokens"))
    assert check.status == "PASS", check
    with pytest.raises(ValueError, match="predictor must be one of .*got 'oracle'"):
        BankBenchConfig(bank=str(path), predictor="oracle")
    with pytest.raises(ValueError, match="the bank's policy 'synthetic' cannot be found here"):  # exists nowhere
        bench_on(path, seeds=1, steps=1, warmup_steps=0, candidates=4, predictor="lm_critic")
    with pytest.raises(ValueError, match="candidates 64 exceed the 32 prompts"):
        bench_on(path, candidates=64)


def test_left_out_prefixes_are_not_offered(tmp_path):
    assert prefix_depths(10, 3) == [1, 5, 9] and prefix_depths(3, None) == [1, 2] and prefix_depths(1, 2) == []
    path = write_synthetic_bank(tmp_path / "c.jsonl.gz", [2], roots=2, continuations=1, turns=5, cap=1)
    runner = BankBranchRunner(BankDraws(0))
    tree = runner.new_tree(0, open_bank(path).prompt(0))
    runner.start_roots(0, 2, BudgetLedger())
    runner.advance(BudgetLedger())
    assert isinstance(tree, BankTree)
    assert [tree.nodes[n].depth for n, _ in tree.expansion_candidates()] == [1, 1]


def test_bank_stats_by_hand(tmp_path):
    path = write_synthetic_bank(tmp_path / "s.jsonl.gz", [0, 2, 4], roots=4, continuations=2)
    st = bank_stats(path)
    assert st["prompts"] == 3 and st["roots"] == 12 and st["prefixes"] == 24 and st["continuations"] == 48
    assert st["success_rate"]["mean"] == pytest.approx(0.5)
    assert st["success_rate"]["histogram"] == {"0": 1, "(0, 0.2]": 0, "(0.2, 0.4]": 0, "(0.4, 0.6]": 1,
                                               "(0.6, 0.8]": 0, "(0.8, 1)": 0, "1": 1}
    assert st["mixed_by_group_size"]["2"] == pytest.approx((0 + 4 / 6 + 0) / 3)
    assert st["flip_by_depth"]["0"]["flip"] == pytest.approx(2 * 2 * 2 / (3 * 4 * 3))  # only prompt 2 differs
    records = list(iter_prompts(path))
    flips = [c["success"] != r["success"] for rec in records for r in rec.roots for p in r["prefixes"]
             for c in p["continuations"] if p["depth"] == 1]
    assert st["flip_by_depth"]["1"] == {"flip": pytest.approx(np.mean(flips)), "continuations": 24}
    by_kind = {str(d): [sum(c["success"] != r["success"] for rec in records for r in rec.roots for p in r["prefixes"]
                            for c in p["continuations"] if p["depth"] == d), 24] for d in (1, 2)}
    assert st["flip_counts_by_kind"] == {"synth": by_kind}  # every task id synth/i: one kind
    from trace_gym.predictor.kinds import ConstantPredictor

    st = bank_stats(path, predictor=ConstantPredictor(0.5))
    assert st["predictor"]["prompts"] == 3 and st["predictor"]["prefixes"] > 0
    assert "flips the observed outcome" in format_bank_stats(st) and "Learned predictor" in format_bank_stats(st)


def test_the_root_of_a_replayed_tree_reads_like_a_live_one(tmp_path):
    path = write_synthetic_bank(tmp_path / "r.jsonl.gz", [1], roots=2, continuations=1)
    runner = BankBranchRunner(BankDraws(0), anchored=True)
    record = open_bank(path).prompt(0)
    runner.new_tree(0, record)
    runner.start_roots(0, 2, BudgetLedger())
    runner.advance(BudgetLedger())
    ctx = runner.node_context(0, ROOT)
    assert (ctx.prompt, ctx.history, ctx.depth, ctx.empirical) == (record.prompt, "", 0, 0.5)
