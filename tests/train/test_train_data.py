"""Where a training run's prompts come from (``environments/train_data.py``), and its
evaluation settings (``evaluators.run.training_eval_config``): training setup reads the
training-data table beside the envs, never the evaluator's suites, and the held-out share has
one home (``trace_gym.env.datafiles.HELDOUT_FRACTION``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from environments.train_data import TRAIN_DATA, train_tasks
from trace_gym.env.datafiles import HELDOUT_FRACTION, split_tasks
from trace_gym.registry import resolve_env

ROOT = Path(__file__).resolve().parents[2]


def test_the_training_data_table_is_not_the_evaluators():
    from evaluators import suites

    assert {"generated", "deepscaler", "bfcl", "hotpotqa"} <= set(TRAIN_DATA)
    assert not {"TRAIN_DATA", "get_train_data", "load_train_data", "generated_train"} & set(vars(suites))
    setups = {"trace_gym/commands/train.py": "resolve_train_setup", "trace_gym/commands/bank.py": "resolve_record"}
    for face, function in setups.items():
        tree = next(n for n in ast.walk(ast.parse((ROOT / face).read_text()))
                    if isinstance(n, ast.FunctionDef) and n.name == function)
        used = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert {m for m, _ in used} & {"environments.train_data"}, face
        assert not [u for u in used if u[0] == "evaluators.suites" or u == ("evaluators", "suites")], face


def test_a_familys_own_tasks_are_drawn_without_the_heldout_split():
    family = resolve_env("guess_number")
    tasks = train_tasks("", family, pool=20, seed=3, heldout_fraction=0.5)
    assert tasks.offline and tasks.description.endswith("minus the held-out 50%")
    drawn = tasks.load()
    assert len(drawn) == 20 and drawn == tasks.load()  # the same prompts each call
    assert split_tasks(drawn, "heldout", 0.5) == []


def test_a_named_set_and_an_unknown_one():
    named = train_tasks("generated", None, pool=8, seed=0, heldout_fraction=HELDOUT_FRACTION)
    assert named.offline and named.description == "generated (generated math family minus its held-out split)"
    assert len(named.load()) == 8 and split_tasks(named.load(), "heldout", HELDOUT_FRACTION) == []
    assert not train_tasks("hotpotqa", None, pool=8, seed=0, heldout_fraction=0.2).offline
    assert train_tasks("hotpotqa", None, pool=8, seed=0, heldout_fraction=0.2, path="hq.jsonl").offline
    with pytest.raises(ValueError, match=r"^unknown training data 'generatd'; did you mean generated\?; known: \['bfcl', "):
        train_tasks("generatd", None, pool=8, seed=0, heldout_fraction=0.2)


def test_the_heldout_share_has_one_home():
    from evaluators.run import EvalConfig
    from trace_gym.train.config import TrainConfig

    assert TrainConfig().heldout_fraction == EvalConfig().heldout_fraction == HELDOUT_FRACTION == 0.2
    for path in ("trace_gym/train/config.py", "evaluators/run.py", "evaluators/suites.py",
                 "environments/train_data.py"):
        literal = [n.lineno for n in ast.walk(ast.parse((ROOT / path).read_text()))
                   if isinstance(n, ast.Constant) and n.value == 0.2]
        assert literal == [], (path, literal)


def test_a_training_runs_eval_settings():
    from evaluators.run import TrainingEvaluator, training_eval_config
    from trace_gym.commands.train import resolve_train_setup
    from trace_gym.train.config import TrainConfig

    cfg = TrainConfig(eval_every=2, eval_suite="generated", eval_tasks=5, eval_samples=3, temperature=0.7,
                      max_turns=2, seed=4)
    got = training_eval_config(cfg)
    assert (got.policy, got.suites, got.limit, got.samples, got.temperature, got.seed, got.max_turns) == (
        (cfg.policy,), ("generated",), 5, 3, 0.7, 4, 2)
    assert training_eval_config(dataclasses.replace(cfg, eval_samples=1)).temperature == 0.0  # one sample: greedy
    setup = resolve_train_setup(cfg)
    assert setup.evaluate == TrainingEvaluator(got)
    assert resolve_train_setup(dataclasses.replace(cfg, eval_every=0)).evaluate is None
    with pytest.raises(ValueError, match="generatd"):  # a bad suite fails at setup, evaluated or not
        resolve_train_setup(dataclasses.replace(cfg, eval_every=0, eval_suite="generatd"))
