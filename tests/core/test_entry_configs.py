"""Every entry point's config is listed in one table and composed of the shared sections."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from trace_gym.config_sections import SECTIONS, AgentLimits, BudgetShape, section_of
from trace_gym.commands import ENTRY_CONFIGS
from trace_gym.utils.targets import load_target

ROOT = Path(__file__).resolve().parents[2]
#: section class -> its name in field metadata
SECTION_NAMES = {BudgetShape: "budget", AgentLimits: "agent"}


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
    listed = {load_target(t) for t in ENTRY_CONFIGS.values()}
    found = set()
    for pkg in ("trace_gym", "evaluators", "environments", "baselines"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Config") \
                        and (ast.get_docstring(node) or "").startswith("``trace-gym"):
                    rel = path.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
                    found.add(load_target(f"{rel}:{node.name}"))
    assert found == listed


@pytest.mark.parametrize("command", sorted(ENTRY_CONFIGS))
def test_each_config_takes_the_shared_fields_from_their_sections(command):
    cls, shared = load_target(ENTRY_CONFIGS[command]), section_fields()
    for f in dataclasses.fields(cls):
        if f.name in shared and isinstance(cls, type) and issubclass(cls, shared[f.name][0]):
            assert section_of(f) == shared[f.name][1], f"{cls.__name__}.{f.name} redefines the section's field"
    # a config with a budget shape or agent limits takes them as a section, not as its own fields
    names = {f.name for f in dataclasses.fields(cls)}
    for section in (BudgetShape, AgentLimits):
        mine = {f.name for f in dataclasses.fields(section)}
        if mine <= names:
            if cls.__name__ == "EvalConfig" and section is AgentLimits:
                continue  # eval's limits mean "0: the suite's default" (documented in evaluators.run)
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
    from trace_gym.banks.config import BankRecordConfig
    from trace_gym.bench.config import EnvBenchConfig, SimBenchConfig
    from trace_gym.train.config import TrainConfig

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
    from trace_gym.bench.config import BankBenchConfig, SimBenchConfig

    field = {f.name: f for f in dataclasses.fields(SimBenchConfig)}["root_budget"]
    assert field.default == 256 and BudgetShape.__dataclass_fields__["root_budget"].default == 8
    assert field.metadata["help"] == BudgetShape.__dataclass_fields__["root_budget"].metadata["help"]
    # bench --bank sizes M to the bank when it is not given: its own default (None) and help, the section's key
    field = {f.name: f for f in dataclasses.fields(BankBenchConfig)}["root_budget"]
    assert field.default is None and section_of(field) == "budget" and "smaller bank" in field.metadata["help"]


def test_the_prefix_share_default_has_one_home():
    """0.06 (the paper's share of prefix samples in the predictor's batch) is written once, in
    the learning half of the step; the configs and the bank's predictor check take it from there."""
    import inspect

    from trace_gym.banks.stats import predictor_spearman
    from trace_gym.config_sections import PredictorChoice
    from trace_gym.step.learning import PREFIX_SHARE

    written = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "trace_gym").rglob("*.py"))
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant) and n.value == 0.06]
    assert written == ["trace_gym/step/learning.py"]
    assert PredictorChoice().prefix_share == PREFIX_SHARE
    assert inspect.signature(predictor_spearman).parameters["prefix_share"].default == PREFIX_SHARE


def test_agent_limits_reach_the_loop_by_name_and_their_defaults_differ_on_purpose():
    """Each limit of the agent section that the loop has reaches ``AgentConfig`` by name; the
    section's defaults are the commands' CPU-sized ones, and its docstring gives both sets."""
    from trace_gym.agent.loop import AgentConfig
    from trace_gym.config_sections import AgentLimits
    from trace_gym.train.config import TrainConfig

    loop = TrainConfig(max_turns=2, max_turn_tokens=7, max_episode_tokens=99).agent_config()
    assert (loop.max_turns, loop.max_turn_tokens, loop.max_episode_tokens) == (2, 7, 99)
    assert loop.env_workers == AgentConfig().env_workers  # what the section does not set keeps the loop's default
    shared = {f.name for f in dataclasses.fields(AgentLimits)} & {f.name for f in dataclasses.fields(AgentConfig)}
    assert shared == {"max_turns", "max_turn_tokens", "max_episode_tokens"}
    for name in sorted(shared):
        ours, loops = getattr(AgentLimits(), name), getattr(AgentConfig(), name)
        assert ours != loops and f"{ours}" in AgentLimits.__doc__ and f"{loops}" in AgentLimits.__doc__, name
