"""The sections every entry-point config is composed of, each written once.

An entry-point config (:mod:`trace_gym.entry_configs`) inherits the sections it has; a
section brings its fields (type, help text), its validation and what is derived from it:

=====================  =====================================================  ==========================
section                fields                                                 derived
=====================  =====================================================  ==========================
:class:`BudgetShape`   ``root_budget`` (M), ``continuations_per_root`` (N),   :attr:`~BudgetShape.
                       ``group_size`` (G)                                     nominal_budget`
:class:`AgentLimits`   ``max_turns``, ``max_turn_tokens``,                    :meth:`~AgentLimits.
                       ``max_episode_tokens``, ``temperature``                agent_config`
:class:`PredictorChoice` ``predictor``, ``predictor_kwargs``, ``prefix_share``  the name checked against
                                                                              :data:`~trace_gym.
                                                                              predictor.PREDICTORS`
:class:`Reproducibility` ``deterministic``                                     :func:`trace_gym.determinism.
                                                                              applied`
=====================  =====================================================  ==========================

Keys stay flat (``root_budget=16``, not ``budget.root_budget=16``): a section is where a key
is *defined*, not a level of the YAML. An entry config whose default differs from the
section's redeclares the field with :func:`section_default`, which keeps the section's help
text and marks the field as the section's. Every entry config's ``__post_init__`` calls
:func:`check_sections`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_gym.config import doc
from trace_gym.predictor import check_predictor_name, predictor_names

__all__ = ["AgentLimits", "BenchTarget", "BudgetShape", "PredictorChoice", "Reproducibility", "SECTIONS", "check_sections",
           "section_default", "section_of"]


def _in(section: str, text: str) -> dict[str, str]:
    return {**doc(text), "section": section}


def section_of(f: dataclasses.Field) -> str | None:
    """The section a dataclass field was defined by (``None``: the config's own field)."""
    return f.metadata.get("section")


def section_default(section: type, name: str, default: Any, help: str | None = None) -> Any:
    """A field of ``section`` with another default (and optionally a more specific help text)."""
    base = section.__dataclass_fields__[name]
    metadata = {**base.metadata, **({"help": help} if help else {})}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class BudgetShape:
    """The budget section: the tree shape (M roots, N continuations per root) and the fixed
    group size G of the group strategies, at the same nominal budget ``M (1 + N/2)``."""

    root_budget: int = field(default=8, metadata=_in("budget", "M: root rollouts of a tree strategy per step"))
    continuations_per_root: int = field(default=2, metadata=_in(
        "budget", "N: continuations per root; nominal budget = M (1 + N/2)"))
    group_size: int = field(default=4, metadata=_in(
        "budget", "G: group size of every fixed-group strategy (uniform, pcl)"))
    strategy_timeout_s: float = field(default=30.0, metadata=_in(
        "budget", "seconds one call into a strategy's code may take (its boundary's deadline; past it the arm "
                  "gets no verdict)"))

    @property
    def nominal_budget(self) -> float:
        """``M (1 + N/2)`` trajectory-equivalents per step (:func:`trace_gym.budget.nominal_cost`)."""
        from trace_gym.budget import nominal_cost

        if self.root_budget is None:
            raise ValueError(f"{type(self).__name__}.root_budget is None: its entry point sizes it first")
        return nominal_cost(self.root_budget, self.continuations_per_root)

    def _check_budget(self) -> None:
        # None: an entry point that sizes M itself (bench --bank: to the bank's prompts)
        if (self.root_budget is not None and self.root_budget < 2) or self.continuations_per_root < 0:
            raise ValueError(f"need root_budget >= 2 and continuations_per_root >= 0, got "
                             f"{self.root_budget!r}, {self.continuations_per_root!r}")
        if self.group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {self.group_size!r}")
        t = self.strategy_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 86_400:
            raise ValueError(f"strategy_timeout_s must be a number of seconds in (0, 86400), got {t!r}")


@dataclass(frozen=True)
class AgentLimits:
    """The agent section: the limits of one episode of the agent loop (tokens, turns, sampling)."""

    max_turns: int = field(default=3, metadata=_in("agent", "turns per episode"))
    max_turn_tokens: int = field(default=160, metadata=_in("agent", "generated tokens per turn"))
    max_episode_tokens: int = field(default=1024, metadata=_in("agent", "context limit per episode, tokens"))
    temperature: float = field(default=1.0, metadata=_in("agent", "rollout sampling temperature"))

    def agent_config(self) -> Any:
        """The :class:`trace_gym.agent.AgentConfig` of these limits."""
        from trace_gym.agent import AgentConfig

        return AgentConfig(max_turn_tokens=self.max_turn_tokens, max_episode_tokens=self.max_episode_tokens,
                           max_turns=self.max_turns)

    def _check_agent(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_episode_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")


@dataclass(frozen=True)
class PredictorChoice:
    """The predictor section: which success predictor the predictor-driven strategies use.

    ``PREDICTOR_READS`` (a class constant) says what the predictor reads: ``"text"`` (real
    rollouts, banks, training) or ``"sim"`` (the simulator's task features)."""

    PREDICTOR_READS: ClassVar[str] = "text"

    predictor: str = field(default="embedding", metadata=_in(
        "predictor", "success predictor: " + " | ".join(predictor_names("text"))))
    predictor_kwargs: dict = field(default_factory=dict, metadata=_in(
        "predictor", "JSON object of the predictor's keyword arguments, e.g. {\"device\": \"cuda\", "
        "\"dtype\": \"bfloat16\"}"))
    prefix_share: float = field(default=0.06, metadata=_in(
        "predictor", "share of the predictor's batch weight on prefix samples (the paper: about 6 %)"))

    def _check_predictor(self) -> None:
        check_predictor_name(self.predictor, self.PREDICTOR_READS)
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"prefix_share must lie in [0, 1), got {self.prefix_share!r}")


@dataclass(frozen=True)
class Reproducibility:
    """The reproducibility section: whether a run is a function of its config and seed only
    (:mod:`trace_gym.determinism`: fixed CPU threads whatever the load, torch's deterministic
    algorithms, env rounds independent of timing)."""

    deterministic: bool = field(default=False, metadata=_in(
        "reproducibility", "a run is a function of its config and seed, whatever the machine's load: fixed CPU "
        "threads ($TRACE_GYM_THREADS, else 1), torch's deterministic algorithms, every env step waited for "
        "(docs/training.md, Deterministic mode)"))

    def _check_reproducibility(self) -> None:
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic must be true or false, got {self.deterministic!r}")


@dataclass(frozen=True)
class BenchTarget:
    """The bench's target section: what counts a group as mixed (:mod:`trace_gym.mixed`), and how many
    mixed groups an arm must collect for the budget-to-target measure."""

    mixed_groups_target: int = field(default=8, metadata=_in(
        "target", "mixed groups an arm must collect over its measured steps; its exact generated tokens until then "
                  "are the budget-to-target metric (tokens to target)"))

    mixed_rule: str = field(default="threshold", metadata=_in(
        "target", "what counts a group as mixed: threshold (a success and a failure, success = reward >= 0.5) | "
                  "spread (reward max - min > mixed_spread; for continuous rewards, trace_gym/mixed.py)"))
    mixed_spread: float = field(default=0.0, metadata=_in(
        "target", "with mixed_rule=spread: the reward range a group must exceed to count as mixed (reward units)"))

    def mixed(self) -> Any:
        """The :class:`~trace_gym.mixed.MixedRule` of ``mixed_rule`` and ``mixed_spread``."""
        from trace_gym.mixed import MixedRule

        return MixedRule(self.mixed_rule, self.mixed_spread)

    def _check_target(self) -> None:
        n = self.mixed_groups_target
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 1_000_000:
            raise ValueError(f"mixed_groups_target must be an integer in [1, 1000000], got {n!r}")
        self.mixed()  # one line naming a bad mixed_rule or mixed_spread


#: Every section, and the check each brings.
SECTIONS: dict[type, str] = {BudgetShape: "_check_budget", AgentLimits: "_check_agent",
                             PredictorChoice: "_check_predictor", Reproducibility: "_check_reproducibility",
                             BenchTarget: "_check_target"}


def check_sections(cfg: Any) -> None:
    """Run the checks of every section ``cfg`` is composed of (``ValueError`` naming the key)."""
    for section, check in SECTIONS.items():
        if isinstance(cfg, section):
            getattr(cfg, check)()
