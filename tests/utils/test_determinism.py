"""Deterministic mode's parts (trace_gym/utils/determinism.py): the thread count follows the user's
word and never the load, enabling it sets torch and the env for the whole process, and an
engine that cannot promise the same samples is named. The end-to-end check (a tiny training
run beside a busy process) is tests/train/test_deterministic.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trace_gym.utils import determinism
from trace_gym.utils.threads import ThreadDecision

ROOT = Path(__file__).resolve().parents[2]


def measured(n: int) -> ThreadDecision:
    """A budget the load policy measured (``n`` threads of 2 cores)."""
    return ThreadDecision(n, "measured", 2, None, 0.0, 0.0, 2.0 - n)


def test_the_count_is_the_users_word_else_one_whatever_the_load_gave(monkeypatch):
    # no thread policy ran in this process (an earlier in-process CLI call may have run one)
    monkeypatch.setattr("trace_gym.utils.threads._DECISION", None)
    # an idle box (2 measured) and a busy one (1 measured) give the same count
    assert determinism.fixed_threads({"OMP_NUM_THREADS": "2"}, measured(2)) == (1, "the fixed default")
    assert determinism.fixed_threads({"OMP_NUM_THREADS": "1"}, measured(1)) == (1, "the fixed default")
    # the user's word, as the CLI's policy recorded it
    assert determinism.fixed_threads({}, ThreadDecision(3, "TRACE_GYM_THREADS", 2)) == (3, "$TRACE_GYM_THREADS")
    assert determinism.fixed_threads({}, ThreadDecision(2, "OMP_NUM_THREADS", 2)) == (2, "$OMP_NUM_THREADS")
    # a library user's process (no policy ran): the environment is the user's
    assert determinism.fixed_threads({"TRACE_GYM_THREADS": "4", "OMP_NUM_THREADS": "2"}, None)[0] == 4
    assert determinism.fixed_threads({"OMP_NUM_THREADS": "0"}, None) == (1, "the fixed default")


ENABLE = """
import json, os, sys
from trace_gym.utils import determinism
from trace_gym.utils import threads
decision, torch_first = json.loads(sys.argv[1])
threads._DECISION = threads.ThreadDecision(*decision)  # what the CLI's policy decided at start
os.environ["OMP_NUM_THREADS"] = str(threads._DECISION.threads)  # and wrote
if torch_first:
    import torch
    torch._C.set_num_threads(threads._DECISION.threads)
mode = determinism.enable()
assert determinism.enable() is mode and determinism.active() is mode
assert torch_first == ("torch" in sys.modules)  # enabling loads no torch (bench --sim never needs it)
import torch  # now, or already: its switches are set either way
from threadpoolctl import threadpool_info
print(json.dumps({"threads": torch.get_num_threads(), "omp": os.environ["OMP_NUM_THREADS"],
                  "blas": sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}),
                  "algorithms": torch.are_deterministic_algorithms_enabled(),
                  "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
                  "cublas": os.environ["CUBLAS_WORKSPACE_CONFIG"], "line": mode.describe()}))
"""


@pytest.mark.parametrize("torch_first", [True, False])
@pytest.mark.parametrize("decision, threads", [((2, "measured", 2), 1), ((3, "TRACE_GYM_THREADS", 2), 3)])
def test_enable_sets_the_count_torch_and_the_env_for_the_whole_process(decision, threads, torch_first):
    pytest.importorskip("threadpoolctl")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG")}
    out = subprocess.run([sys.executable, "-c", ENABLE, json.dumps([decision, torch_first])], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert (got["threads"], got["omp"], got["algorithms"], got["cublas"]) == (threads, str(threads), True, ":4096:8")
    assert got["cudnn"] == [True, False]
    assert got["blas"] in ([], [threads])  # numpy's BLAS, where threadpoolctl finds one
    assert got["line"].startswith(f"deterministic mode: {threads} CPU thread(s)")


def test_applied_holds_the_mode_for_one_block_and_gives_the_process_back(monkeypatch):
    """A library user's bench (deterministic by default) leaves the next call in the same
    process as it found it: threads, OMP_NUM_THREADS, torch's switch, the agent loop's rounds."""
    import dataclasses

    import torch

    from trace_gym.bench.config import BankBenchConfig

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv(threads_env := "TRACE_GYM_THREADS", raising=False)
    monkeypatch.setattr("trace_gym.utils.threads._DECISION", measured(2))  # the CLI's policy saw an idle box
    before = torch.get_num_threads()
    torch._C.set_num_threads(2)
    try:
        with determinism.applied(BankBenchConfig()) as mode:
            assert mode == determinism.DeterministicMode(1, "the fixed default") and determinism.active() is mode
            assert torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
            assert torch.are_deterministic_algorithms_enabled()
            with determinism.applied(dataclasses.replace(BankBenchConfig(), deterministic=False)) as inner:
                assert inner is mode  # a nested block goes on in the mode
        assert determinism.active() is None and torch.get_num_threads() == 2 and os.environ["OMP_NUM_THREADS"] == "2"
        assert not torch.are_deterministic_algorithms_enabled() and threads_env not in os.environ
        with determinism.applied(dataclasses.replace(BankBenchConfig(), deterministic=False)) as off:
            assert off is None and torch.get_num_threads() == 2
    finally:
        torch._C.set_num_threads(before)


def test_an_engine_that_cannot_promise_the_same_samples_is_named(monkeypatch):
    from trace_gym.engines.hf import HFEngine
    from trace_gym.engines.vllm import VLLMEngine

    monkeypatch.setattr(determinism, "_ACTIVE", None)
    assert determinism.engine_note(object()) is None  # not in the mode: nothing to say
    monkeypatch.setattr(determinism, "_ACTIVE", determinism.DeterministicMode(1, "the fixed default"))
    assert HFEngine.deterministic and determinism.engine_note(HFEngine.__new__(HFEngine)) is None
    note = determinism.engine_note(VLLMEngine.__new__(VLLMEngine))
    assert note.startswith("WARNING: deterministic mode: the VLLMEngine engine") and "batch-invariant" in note
    assert "does not declare itself deterministic" in determinism.engine_note(object())


def test_the_switch_is_a_key_and_a_flag_of_train_and_every_bench_mode():
    from trace_gym.config import load_config
    from trace_gym.bench.config import BankBenchConfig, EnvBenchConfig, SimBenchConfig
    from trace_gym.train.config import TrainConfig

    assert TrainConfig().deterministic is False
    assert load_config(TrainConfig, None, {"deterministic": "true"}).deterministic is True
    for cls in (SimBenchConfig, EnvBenchConfig, BankBenchConfig):
        assert cls().deterministic is True  # benches: the repetitions are a function of their seeds
        assert load_config(cls, None, {"deterministic": "false"}).deterministic is False
    with pytest.raises(ValueError, match="deterministic"):
        load_config(TrainConfig, None, {"deterministic": "maybe"})
    with pytest.raises(ValueError, match="deterministic must be true or false, got 'yes'"):
        TrainConfig(deterministic="yes")
