"""A new user's first hour with ``trace-gym eval`` (issue 41): every env id this repo
registers is a suite by its id, offline, through the real evaluator entry point; a hub
suite out of reach is one line naming ``data_dir``, in seconds, not a traceback after 30."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_eval_user import no_network  # noqa: F401  (a fixture: every connection refused, the hub off)

from environments.train_data import load_train_data
from evaluators import suites
from trace_gym.cli import main
from trace_gym.env.datafiles import HUB_OFFLINE_VARS, split_tasks
from trace_gym.registry import BUILTIN_ENVS, NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
#: agent-loop limits that keep one tiny-model episode to a fraction of a second
FAST = ["limit=1", "max_turns=1", "max_turn_tokens=4", "max_episode_tokens=12288", "progress=false"]
#: task-loader and env keyword arguments naming a smaller world where an env has one (both sides alike)
SMALL_WORLD = {"WikiQA-v0": {"offline_scale": 0.03}}


@pytest.fixture(scope="module")
def long_tiny_model(tmp_path_factory, smollm2_path):
    """The tiny random model with a 12k context: a BFCL prompt (its function docs) is ~9k tokens."""
    from trace_gym.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny12k") / "model", tokenizer_from=smollm2_path,
                             max_position_embeddings=12288)


@pytest.mark.parametrize("name", sorted(BUILTIN_ENVS))
def test_every_registered_env_id_is_a_suite_offline(name, tmp_path, long_tiny_model, no_network):  # noqa: F811
    env_id = f"{NAMESPACE}/{name}"
    small = [f"{key}={json.dumps(SMALL_WORLD[name])}" for key in ("env_kwargs", "task_kwargs")] \
        if name in SMALL_WORLD else []
    out = tmp_path / "out"
    code = main(["eval", "--policy", str(long_tiny_model), "--suite", env_id, f"out={out}",
                 f"cache_dir={tmp_path / 'cache'}", *FAST, *small])
    assert code == 0
    (row,) = json.loads((out / "results.json").read_text())
    assert row["suite"] == env_id and row["tasks"] == 1 and not row["cached"]
    assert row["generated_tokens"] > 0 and 0.0 <= row["accuracy"] <= 1.0
    # the tasks are the held-out split of the env's own loader: prompts `train` on the id never trains on
    tasks = suites.get_suite(env_id, SMALL_WORLD.get(name)).load(1)
    assert list(row["per_task"]) == [t.id for t in tasks]
    assert split_tasks(tasks, "heldout", 0.2) == tasks and no_network == []


def test_the_offline_qa_world_by_id_draws_the_env_s_own_questions():
    """``trace_gym/WikiQA-v0``'s loader is the env's default pool (two-hop questions of the
    SYNTHETIC world it searches), held out as the `wiki_qa` suite holds them out."""
    from environments.wiki_qa.data import offline_tasks

    by_id = suites.get_suite("trace_gym/WikiQA-v0", {"offline_scale": 0.03}).load(None)  # all of a small world
    world = offline_tasks(None, seed=None, scale=0.03)
    assert by_id and {t.prompt for t in by_id} == {t.prompt for t in split_tasks(world, "heldout", 0.2)}
    assert all(t.metadata["type"] != "single_hop" for t in by_id)
    with pytest.raises(ValueError, match="task_kwargs applies to suites that are env ids"):
        from evaluators.run import EvalConfig

        EvalConfig(suites=("generated",), task_kwargs={"offline_scale": 0.03})


def test_a_hub_suite_out_of_reach_is_one_line_naming_data_dir_fast(tmp_path, capsys, monkeypatch, tiny_model_path):
    import socket

    def refuse(self, address, *args, **kwargs):
        raise OSError(f"test: no network ({address!r})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    for var in HUB_OFFLINE_VARS:  # not set offline: the hub is probed once, without retries
        monkeypatch.delenv(var, raising=False)
    t0 = time.perf_counter()
    code = main(["eval", "--policy", str(tiny_model_path), "--suite", "aime24", f"out={tmp_path / 'out'}",
                 f"cache_dir={tmp_path / 'cache'}", "progress=false"])
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "suite 'aime24' reads HuggingFaceH4/aime_2024 from the hub, which cannot be reached" in err[0]
    assert "data_dir=DIR holding aime24.jsonl" in err[0] and "rows with 'problem' and 'answer'" in err[0]
    assert seconds < 15  # the probe waits 3 s at most; the datasets client took 33-45 s of retries
    # training data the same way, naming its own key
    with pytest.raises(ValueError, match=r"data=hotpotqa reads RUC-NLPIR/FlashRAG_datasets \(config hotpotqa\) "
                                         r"from the hub, .*data_path=FILE.*'question' and 'golden_answers'"):
        load_train_data("hotpotqa", 2, 0, None)


def test_a_hub_suite_with_the_hub_set_offline_and_nothing_cached_is_one_line(tmp_path, tiny_model_path):
    """``HF_HUB_OFFLINE=1`` (``datasets`` reads it when it loads, hence a fresh interpreter) and
    an empty datasets cache: ``datasets`` refuses at once, and the refusal is the same one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-m", "trace_gym.cli", "eval", "--policy", str(tiny_model_path),
                           "--suite", "hotpotqa", f"out={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert "suite 'hotpotqa' reads RUC-NLPIR/FlashRAG_datasets (config hotpotqa) from the hub" in err[0]
    assert "OfflineModeIsEnabled" in err[0] and "data_dir=DIR holding hotpotqa.jsonl" in err[0]
