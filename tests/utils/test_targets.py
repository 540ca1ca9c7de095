"""``"module:attr"`` strings are read in one place (:func:`trace_gym.utils.targets.load_target`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trace_gym.utils.targets import load_target

ROOT = Path(__file__).resolve().parents[2]


def test_a_target_names_a_module_an_attribute_or_a_dotted_one():
    import trace_gym.predictor.kinds as kinds

    assert load_target("trace_gym.predictor.kinds") is kinds
    assert load_target("trace_gym.predictor.kinds:make_predictor") is kinds.make_predictor
    assert load_target("trace_gym.sim.predictors:NoisyOraclePredictor.with_spearman").__name__ == "with_spearman"
    with pytest.raises(ModuleNotFoundError):
        load_target("trace_gym.no_such_module:x")
    with pytest.raises(AttributeError):
        load_target("trace_gym.predictor.kinds:no_such_name")


def reads_targets_itself(source: str) -> list[str]:
    """Functions of ``source`` that split a string at ``":"``, import a module and take an
    attribute of it: a second reader of ``"module:attr"``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
        splits = any(c.func.attr in ("partition", "split", "rpartition") and c.args
                     and isinstance(c.args[0], ast.Constant) and c.args[0].value == ":" for c in calls)
        takes = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "getattr"
                    for c in ast.walk(node))
        if splits and takes and any(c.func.attr == "import_module" for c in calls):
            found.append(node.name)
    return found


def test_no_other_module_reads_module_attr_strings():
    offenders = {p.relative_to(ROOT).as_posix(): names for pkg in ("trace_gym", "environments", "evaluators")
                 for p in sorted((ROOT / pkg).rglob("*.py")) if p.name != "targets.py"
                 if (names := reads_targets_itself(p.read_text(encoding="utf-8")))}
    assert offenders == {}


def test_the_check_sees_a_second_reader():
    planted = ("import importlib\n\ndef load(t):\n    module, _, attr = t.partition(':')\n"
               "    return getattr(importlib.import_module(module), attr)\n")
    assert reads_targets_itself(planted) == ["load"]
