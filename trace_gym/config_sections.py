"""The sections every entry-point config is composed of, each written once.

An entry point's config (beside it; :data:`trace_gym.commands.ENTRY_CONFIGS` lists them)
inherits the sections it has; a section brings its fields (type, help text), its validation
and what is derived from it:

=====================  =====================================================  ==========================
section                fields                                                 derived
=====================  =====================================================  ==========================
:class:`BudgetShape`   ``root_budget`` (M), ``continuations_per_root`` (N),   :attr:`~BudgetShape.
                       ``group_size`` (G)                                     nominal_budget`
:class:`AgentLimits`   ``max_turns``, ``max_turn_tokens``,                    :meth:`~AgentLimits.
                       ``max_episode_tokens``, ``temperature``                agent_config`
:class:`PredictorChoice` ``predictor``, ``predictor_kwargs``, ``prefix_share``  the name checked against
                                                                              :data:`~trace_gym.predictor.
                                                                              kinds.PREDICTORS`
:class:`Reproducibility` ``deterministic``                                     :func:`trace_gym.utils.determinism.
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
from typing import Any, Callable, ClassVar

from trace_gym.config import check_declared, doc
from trace_gym.predictor.kinds import check_predictor_kwargs, check_predictor_name, predictor_names
from trace_gym.step.learning import PREFIX_SHARE
from trace_gym.utils.config_fields import MAX_COUNT, SEEDS

__all__ = ["AgentLimits", "BenchTarget", "BudgetShape", "MAX_COUNT", "PredictorChoice", "Reproducibility", "SECTIONS",
           "SEEDS", "check_sections", "section_default", "section_of"]


def _in(section: str, text: str | Callable[[], str], within: str | None = None) -> dict[str, Any]:
    return {**doc(text, within=within), "section": section}


def section_of(f: dataclasses.Field) -> str | None:
    """The section a dataclass field was defined by (``None``: the config's own field)."""
    return f.metadata.get("section")


def section_default(section: type, name: str, default: Any, help: str | Callable[[], str] | None = None) -> Any:
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

    root_budget: int = field(default=8, metadata=_in(
        "budget", "M: root rollouts of a tree strategy per step", within=f"[2, {MAX_COUNT}]"))
    continuations_per_root: int = field(default=2, metadata=_in(
        "budget", "N: continuations per root; nominal budget = M (1 + N/2)", within="[0, 1024]"))
    group_size: int = field(default=4, metadata=_in(
        "budget", "G: group size of every fixed-group strategy (uniform, pcl)", within=f"[1, {MAX_COUNT}]"))
    strategy_timeout_s: float = field(default=30.0, metadata=_in(
        "budget", "seconds one call into a strategy's code may take (its boundary's deadline; past it the arm "
                  "gets no verdict)", within="(0, 86400)"))

    @property
    def nominal_budget(self) -> float:
        """``M (1 + N/2)`` trajectory-equivalents per step (:func:`trace_gym.budget.nominal_cost`)."""
        from trace_gym.budget import nominal_cost

        if self.root_budget is None:
            raise ValueError(f"{type(self).__name__}.root_budget is None: its entry point sizes it first")
        return nominal_cost(self.root_budget, self.continuations_per_root)



@dataclass(frozen=True)
class AgentLimits:
    """The agent section: the limits of one episode of the agent loop (tokens, turns, sampling).

    Its defaults (3 turns of at most 160 tokens, 1024 tokens an episode) are the commands' and
    smaller than :class:`trace_gym.agent.loop.AgentConfig`'s (8 turns of 384 tokens, 2048 an
    episode) on purpose: a command's default run is sized for the 2-core CPU machine and
    SmolLM2-135M (design.md), while ``AgentConfig()`` is the library's default for a caller
    that builds an agent loop itself. Each limit below that ``AgentConfig`` has is passed to
    it by name (:meth:`agent_config`), so the two never disagree on what a limit means.
    """

    max_turns: int = field(default=3, metadata=_in("agent", "turns per episode", within="[1, 10000]"))
    max_turn_tokens: int = field(default=160, metadata=_in(
        "agent", "generated tokens per turn", within=f"[1, {MAX_COUNT}]"))
    max_episode_tokens: int = field(default=1024, metadata=_in(
        "agent", "context limit per episode, tokens", within="[1, 10000000]"))
    temperature: float = field(default=1.0, metadata=_in("agent", "rollout sampling temperature", within="[0, 100]"))

    def agent_config(self) -> Any:
        """The :class:`trace_gym.agent.loop.AgentConfig` of these limits: each field of this
        section that ``AgentConfig`` has, by name (``temperature`` is the sampler's, not the
        loop's); the loop's other settings keep ``AgentConfig``'s defaults."""
        from trace_gym.agent.loop import AgentConfig

        loop_fields = {f.name for f in dataclasses.fields(AgentConfig)}
        return AgentConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AgentLimits)
                              if f.name in loop_fields})


@dataclass(frozen=True)
class PredictorChoice:
    """The predictor section: which success predictor the predictor-driven strategies use.

    ``PREDICTOR_READS`` (a class constant) says what the predictor reads: ``"text"`` (real
    rollouts, banks, training) or ``"sim"`` (the simulator's task features)."""

    PREDICTOR_READS: ClassVar[str] = "text"

    predictor: str = field(default="embedding", metadata=_in(
        "predictor", lambda: "success predictor: " + " | ".join(predictor_names("text"))))
    predictor_kwargs: dict = field(default_factory=dict, metadata=_in(
        "predictor", "JSON object of the predictor's keyword arguments, e.g. {\"device\": \"cuda\", "
        "\"dtype\": \"bfloat16\"}"))
    prefix_share: float = field(default=PREFIX_SHARE, metadata=_in(
        "predictor", "share of the predictor's batch weight on prefix samples (the paper: about 6 %)",
        within="[0, 1)"))

    def _check_predictor(self) -> None:
        check_predictor_name(self.predictor, self.PREDICTOR_READS)
        check_predictor_kwargs(self.predictor, self.predictor_kwargs)  # against the kind's signature


@dataclass(frozen=True)
class Reproducibility:
    """The reproducibility section: whether a run is a function of its config and seed only
    (:mod:`trace_gym.utils.determinism`: fixed CPU threads whatever the load, torch's deterministic
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
    """The bench's target section: what counts a group as mixed (:mod:`trace_gym.step.mixed`), and how many
    mixed groups an arm must collect for the budget-to-target measure."""

    mixed_groups_target: int = field(default=8, metadata=_in(
        "target", "mixed groups an arm must collect over its measured steps; its exact generated tokens until then "
                  "are the budget-to-target metric (tokens to target)", within=f"[1, {MAX_COUNT}]"))
    mixed_rule: str = field(default="threshold", metadata=_in(
        "target", "what counts a group as mixed: threshold (a success and a failure, success = reward >= 0.5) | "
                  "spread (reward max - min > mixed_spread; for continuous rewards, trace_gym/step/mixed.py)"))
    mixed_spread: float = field(default=0.0, metadata=_in(
        "target", "with mixed_rule=spread: the reward range a group must exceed to count as mixed (reward units)",
        within="[0, 1000000]"))

    def mixed(self) -> Any:
        """The :class:`~trace_gym.step.mixed.MixedRule` of ``mixed_rule`` and ``mixed_spread``."""
        from trace_gym.step.mixed import MixedRule

        return MixedRule(self.mixed_rule, self.mixed_spread)

    def _check_target(self) -> None:
        self.mixed()  # one line naming a bad mixed_rule (mixed_groups_target and mixed_spread: their ranges)


#: Every section, and the check it brings beyond its fields' declared ranges (``None``: none).
SECTIONS: dict[type, str | None] = {BudgetShape: None, AgentLimits: None, PredictorChoice: "_check_predictor",
                                    Reproducibility: "_check_reproducibility", BenchTarget: "_check_target"}


def check_sections(cfg: Any) -> None:
    """Hold ``cfg`` to its fields' declarations (:func:`trace_gym.config.check_declared`: each
    number's range, finite), then run the checks of every section it is composed of
    (``ValueError`` naming the key)."""
    check_declared(cfg)
    for section, check in SECTIONS.items():
        if check is not None and isinstance(cfg, section):
            getattr(cfg, check)()
