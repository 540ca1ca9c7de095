"""Config values are checked when the config is read, before any work (issue 44, class C).

Every field declares its type, range and finiteness once, beside its help
(``doc(..., within="[a, b]")``); dict-valued keys are parsed with the project's bounded
JSON and checked against the callee's signature; YAML keys must be strings. Each refusal
is one line on stderr, exit 2, naming the key and the value, and comes before any model
loads or any simulated work starts (tripwires below turn either into a test failure).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import typing
from pathlib import Path

import pytest

from trace_gym import cli

BANK = str(Path(__file__).resolve().parents[2] / "trace_gym" / "banks" / "data" / "guess_number_smollm2.jsonl.gz")
DEEP = '{"a": ' * 5000 + "1" + "}" * 5000


def refused(argv: list[str], capsys) -> str:
    """The one stderr line of a refused command (exit 2)."""
    rc = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, f"exit {rc}, stderr {err}"
    assert len(err) == 1, err
    return err[0]


# ---------------------------------------------------------------------- non-finite floats
@pytest.mark.parametrize("argv, key, value", [
    (["train", "--dry-run", "trainer.lr=inf"], "trainer.lr", "inf"),
    (["train", "--dry-run", "trainer.kl_coef=inf"], "trainer.kl_coef", "inf"),
    (["train", "--dry-run", "trainer.max_grad_norm=nan"], "trainer.max_grad_norm", "nan"),
    (["train", "--dry-run", "trainer.weight_decay=nan"], "trainer.weight_decay", "nan"),
    (["train", "--dry-run", "advantage_eps=nan"], "advantage_eps", "nan"),
    (["train", "--dry-run", "temperature=inf"], "temperature", "inf"),
    (["eval", "temperature=nan"], "temperature", "nan"),
    (["eval", "temperature=inf"], "temperature", "inf"),
    (["bench", "--sim", "step_concentration=nan"], "step_concentration", "nan"),
    (["bench", "--sim", "step_concentration=inf"], "step_concentration", "inf"),
])
def test_non_finite_floats_are_refused_naming_key_and_value(argv, key, value, tmp_path, capsys, no_work):
    if argv[0] == "train":
        argv = [*argv, f"run_dir={tmp_path / 'run'}"]
    line = refused(argv, capsys)
    assert f"{key}:" in line and value in line and "finite" in line, line


# ---------------------------------------------------------------------- sizes
@pytest.mark.parametrize("argv, words", [
    (["bench", "--sim", f"root_budget={10**15}"], ["root_budget", str(10**15), "1000000"]),
    (["bench", "--sim", f"pool_size={10**11}"], ["pool_size", str(10**11), "1000000"]),
    (["bench", "--sim", "--root-budgets", f"4,{10**14}"], ["--root-budgets", str(10**14), "1000000"]),
    (["bench", "--sim", "--root-budgets", "4,\u00b2"], ["--root-budgets", "'\u00b2'"]),
    (["bench", "--bank", BANK, "seed=-1"], ["seed", "-1", "[0, 4294967295]"]),
])
def test_sizes_are_bounded_in_one_line_naming_the_bound(argv, words, capsys, no_work):
    line = refused(argv, capsys)
    assert all(w in line for w in words), line


def test_every_numeric_field_of_every_entry_config_declares_its_range():
    """The declaration is the check: a count or a rate without a declared range would take anything."""
    from trace_gym.config import field_types
    from trace_gym.commands import ENTRY_CONFIGS

    def numeric(tp) -> bool:
        args = typing.get_args(tp)
        return tp in (int, float) or any(numeric(a) for a in args if a is not Ellipsis)

    missing = []
    for target in ENTRY_CONFIGS.values():
        module, _, name = target.partition(":")
        todo = [getattr(importlib.import_module(module), name)]
        while todo:
            cls = todo.pop()
            for f in dataclasses.fields(cls):
                tp = field_types(cls)[f.name]
                if dataclasses.is_dataclass(tp):
                    todo.append(tp)
                elif numeric(tp) and "within" not in f.metadata:
                    missing.append(f"{cls.__name__}.{f.name}")
    assert not missing


def test_a_config_built_in_python_is_held_to_the_same_ranges():
    from trace_gym.bench.config import SimBenchConfig
    from trace_gym.train.config import TrainConfig
    from trace_gym.train.trainer import TrainerConfig

    with pytest.raises(ValueError, match=r"^pool_size: expected an int in \[1, 1000000\], got 100000000000$"):
        SimBenchConfig(pool_size=10**11)
    with pytest.raises(ValueError, match=r"^trainer.lr: expected a finite number in \(0, 1\], got inf$"):
        TrainerConfig(lr=float("inf"))
    with pytest.raises(ValueError, match=r"^advantage_eps: expected a finite number"):
        TrainConfig(advantage_eps=float("nan"))


# ---------------------------------------------------------------------- dict-valued keys
@pytest.mark.parametrize("argv", [
    ["bench", "--env", "guess_number", f"env_kwargs={DEEP}"],
    ["bench", "--sim", f"predictor_kwargs={DEEP}"],
    ["eval", f"env_kwargs={DEEP}"],
    ["train", "--dry-run", f"env_kwargs={DEEP}"],
    ["bank", "record", "--dry-run", f"env_kwargs={DEEP}"],
    ["check-env", "guess_number", "--env-kwargs", DEEP],
])
def test_dict_values_nested_5000_deep_are_one_line(argv, tmp_path, capsys, no_work):
    if argv[0] == "train":
        argv = [*argv, f"run_dir={tmp_path / 'run'}"]
    line = refused(argv, capsys)
    assert "kwargs" in line and "nested more than" in line, line


@pytest.mark.parametrize("argv, words", [
    (["check-env", "guess_number", "--env-kwargs", '{"bogus": 1}'], ["--env-kwargs", "'bogus'", "GuessNumber"]),
    (["train", "--dry-run", 'env_kwargs={"bogus": 1}'], ["env_kwargs", "'bogus'", "MathPython"]),
    (["bench", "--env", "guess_number", 'task_kwargs={"bogus": 1}'], ["task_kwargs", "'bogus'"]),
    (["bench", "--sim", 'predictor_kwargs={"bogus": 1}'], ["predictor_kwargs", "'bogus'", "learned"]),
    (["bench", "--sim", 'predictor_kwargs={"newton_steps": "x"}'], ["predictor_kwargs", "newton_steps", "'x'",
                                                                     "int"]),
    (["train", "--dry-run", 'predictor_kwargs={"hidden": "x"}'], ["predictor_kwargs", "hidden", "'x'"]),
])
def test_an_unknown_or_ill_typed_kwarg_is_refused_before_the_work(argv, words, tmp_path, capsys, no_work):
    if argv[0] == "train":
        argv = [*argv, f"run_dir={tmp_path / 'run'}"]
    line = refused(argv, capsys)
    assert all(w in line for w in words), line


def test_bench_sim_passes_predictor_kwargs_to_the_predictor():
    """Before issue 44 the simulator built every predictor without the user's kwargs."""
    from trace_gym.bench.sim import SimSource
    from trace_gym.bench.config import SimBenchConfig

    cfg = SimBenchConfig(seeds=1, steps=2, pool_size=64, candidates=16, root_budget=8,
                         predictor_kwargs={"newton_steps": 7, "l2": 0.5})
    source = SimSource(cfg)
    arms = source.arms({"trace": _strategy("trace")})
    learned = source.repetition(0).predictor(arms["trace"])
    assert (learned.newton_steps, learned.l2) == (7, 0.5)
    upper = next(a for a in arms.values() if a.upper_bound)
    assert upper.predictor == "oracle"  # the upper bound's own kind takes none of the user's kwargs
    assert not hasattr(source.repetition(0).predictor(upper), "newton_steps")


def _strategy(name: str):
    from trace_gym.strategies import shaped_strategies

    return shaped_strategies([name], group_size=8, continuations_per_root=2)[name]


# ---------------------------------------------------------------------- YAML keys
@pytest.mark.parametrize("key", ["1", "yes", "~", "3.5"])
@pytest.mark.parametrize("command", [["bench", "--sim"], ["check-env", "guess_number"], ["compare", "x"]])
def test_a_yaml_key_that_is_not_a_string_is_one_line(key, command, tmp_path, capsys, no_work):
    path = tmp_path / "c.yaml"
    path.write_text(f"{key}: 2\n")
    line = refused([*command, "--config", str(path)], capsys)
    assert str(path) in line and "string" in line and key in line, line


def test_compare_refuses_a_run_whose_config_has_a_non_string_key(tmp_path, capsys):
    for name, extra in (("a", ""), ("b", "1: 2\n")):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(f"seed: 0\nstrategy: trace\n{extra}")
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward": 0.5}) + "\n")
    line = refused(["compare", str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert "config.yaml" in line and "string" in line, line


# ---------------------------------------------------------------------- run_dir
def test_an_empty_run_dir_is_refused(capsys, no_work):
    line = refused(["train", "--dry-run", "run_dir="], capsys)
    assert "run_dir" in line and "empty" in line, line
