"""Every entry point's config is listed in one table and composed of the shared sections."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from trace_gym.config_sections import SECTIONS, AgentLimits, BudgetShape, section_of
from trace_gym.entry_configs import ENTRY_CONFIGS

ROOT = Path(__file__).resolve().parents[2]
#: section class -> its name in field metadata
SECTION_NAMES = {BudgetShape: "budget", AgentLimits: "agent"}


def load(target: str) -> type:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def section_fields() -> dict[str, tuple[type, str]]:
    """field name -> (section class, section name) of every shared section."""
    out = {}
    for section in SECTIONS:
        for f in dataclasses.fields(section):
            out[f.name] = (section, section_of(f))
    return out


def test_the_table_lists_every_config_dataclass_of_an_entry_point():
    """No entry-point config outside the table: every frozen dataclass named *Config whose
    docstring starts with a ``trace-gym`` command is listed."""
    listed = {load(t) for t in ENTRY_CONFIGS.values()}
    found = set()
    for pkg in ("trace_gym", "evaluators", "environments", "baselines"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Config") \
                        and (ast.get_docstring(node) or "").startswith("``trace-gym"):
                    rel = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                    found.add(load(f"{rel}:{node.name}"))
    assert found == listed


@pytest.mark.parametrize("command", sorted(ENTRY_CONFIGS))
def test_each_config_takes_the_shared_fields_from_their_sections(command):
    cls, shared = load(ENTRY_CONFIGS[command]), section_fields()
    for f in dataclasses.fields(cls):
        if f.name in shared and isinstance(cls, type) and issubclass(cls, shared[f.name][0]):
            assert section_of(f) == shared[f.name][1], f"{cls.__name__}.{f.name} redefines the section's field"
    # a config with a budget shape or agent limits takes them as a section, not as its own fields
    names = {f.name for f in dataclasses.fields(cls)}
    for section in (BudgetShape, AgentLimits):
        mine = {f.name for f in dataclasses.fields(section)}
        if mine <= names:
            if cls.__name__ == "EvalConfig" and section is AgentLimits:
                continue  # eval's limits mean "0: the suite's default" (documented in entry_configs)
            assert issubclass(cls, section), f"{cls.__name__} types the {section.__name__} fields itself"


def test_nominal_budget_and_the_agent_config_are_written_once():
    hits = []
    for pkg in ("trace_gym", "evaluators", "environments"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            if "def nominal_budget" in text:
                hits.append(path.name)
            if "AgentConfig(max_turn_tokens=cfg." in text:
                hits.append(f"{path.name}: AgentConfig by hand")
    assert hits == ["config_sections.py"]


def test_section_checks_name_the_bad_key():
    from trace_gym.entry_configs import BankRecordConfig, EnvBenchConfig, SimBenchConfig, TrainConfig

    with pytest.raises(ValueError, match=r"^root_budget: expected an int in \[2, 1000000\], got 1$"):
        TrainConfig(root_budget=1)
    with pytest.raises(ValueError, match=r"^max_turn_tokens: expected an int in \[1, 1000000\], got 0$"):
        BankRecordConfig(max_turn_tokens=0)
    with pytest.raises(ValueError, match=r"^prefix_share: expected a finite number in \[0, 1\), got 1.5$"):
        EnvBenchConfig(prefix_share=1.5)
    with pytest.raises(ValueError, match="predictor must be one of .*learned"):
        SimBenchConfig(predictor="embedding")  # the simulator's predictors read task features
    assert TrainConfig(root_budget=6, continuations_per_root=2).nominal_budget == 12
    assert TrainConfig(max_turns=2).agent_config().max_turns == 2


def test_a_config_default_differs_from_the_section_but_keeps_its_help():
    from trace_gym.entry_configs import BankBenchConfig, SimBenchConfig

    field = {f.name: f for f in dataclasses.fields(SimBenchConfig)}["root_budget"]
    assert field.default == 256 and BudgetShape.__dataclass_fields__["root_budget"].default == 8
    assert field.metadata["help"] == BudgetShape.__dataclass_fields__["root_budget"].metadata["help"]
    # bench --bank sizes M to the bank when it is not given: its own default (None) and help, the section's key
    field = {f.name: f for f in dataclasses.fields(BankBenchConfig)}["root_budget"]
    assert field.default is None and section_of(field) == "budget" and "smaller bank" in field.metadata["help"]
