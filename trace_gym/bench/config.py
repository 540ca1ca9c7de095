"""The bench's configs, one per mode: ``bench --sim``, ``bench --env``, ``bench --bank``.

=================  ==========================  ==========================================
command            config                      sections (:mod:`trace_gym.config_sections`)
=================  ==========================  ==========================================
``bench --sim``    :class:`SimBenchConfig`     budget, predictor (reads the simulator),
                                               reproducibility
``bench --env``    :class:`EnvBenchConfig`     budget, agent, predictor, reproducibility
``bench --bank``   :class:`BankBenchConfig`    budget, predictor, reproducibility
=================  ==========================  ==========================================

:data:`trace_gym.commands.ENTRY_CONFIGS` lists them (``tests`` check that each takes the shared sections'
fields from the sections). Each field is a YAML key, a ``key=value`` override and a
``--key`` flag; :mod:`trace_gym.config` loads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_gym.config import doc
from trace_gym.config_sections import (AgentLimits, BenchTarget, BudgetShape, PredictorChoice, Reproducibility,
                                       check_sections, section_default)
from trace_gym.predictor.kinds import predictor_names
from trace_gym.utils.config_fields import MAX_COUNT, SEEDS

#: What a bench equalises across strategies: the nominal budget or the exact generated tokens.
BUDGET_UNITS = ("nominal", "tokens")


def _check_unit(cfg: Any) -> None:
    if cfg.budget_unit not in BUDGET_UNITS:
        raise ValueError(f"budget_unit must be one of {list(BUDGET_UNITS)}, got {cfg.budget_unit!r}")


def _check_measured_steps(cfg: Any) -> None:
    if not 0 <= cfg.warmup_steps < cfg.steps:
        raise ValueError(f"warmup_steps must lie in [0, steps={cfg.steps}), got {cfg.warmup_steps!r}")


_PLUGINS = doc("modules to import first (not installed plugins: their envs and strategies register on import)")
_STRATEGIES = doc("comma-separated strategy names (default: all)")


# ---------------------------------------------------------------------- bench --sim
@dataclass(frozen=True)
class SimBenchConfig(BudgetShape, PredictorChoice, Reproducibility, BenchTarget):
    """``trace-gym bench --sim``: strategies on simulated tasks with a known success martingale.

    The default is paper-like: a GRPO baseline with groups of 8 that are mixed about
    27 % of the time (DeepScaleR with Qwen3-8B), the (M, N) = (M, 2) tree shape the
    paper found best, and a candidate pool as large as the root budget so the root
    stage can skip most prompts (the paper skipped 65-71 %). Every predictor-driven
    strategy uses the *learned* predictor; the oracle runs once more, labelled as an
    upper bound.
    """

    PREDICTOR_READS: ClassVar[str] = "sim"

    seeds: int = field(default=3, metadata=doc("independent seeds (a fresh task pool each)", within="[1, 10000]"))
    steps: int = field(default=5, metadata=doc(
        "allocation steps per seed (a fresh candidate pool each)", within="[1, 100000]"))
    warmup_steps: int = field(default=1, metadata=doc(
        "first steps run (the predictor trains) but not measured", within="[0, 100000]"))
    pool_size: int = field(default=4096, metadata=doc("simulated tasks in the dataset", within=f"[1, {MAX_COUNT}]"))
    candidates: int = field(default=256, metadata=doc("candidate prompts scored per step", within=f"[1, {MAX_COUNT}]"))
    root_budget: int = section_default(BudgetShape, "root_budget", 256)
    group_size: int = section_default(BudgetShape, "group_size", 8)
    predictor: str = section_default(PredictorChoice, "predictor", "learned", help=lambda: (
        "predictor of every predictor-driven strategy: " + " | ".join(predictor_names("sim"))))
    noisy_spearman: float = field(default=0.8, metadata=doc(
        "prompt-level Spearman of the noisy oracle", within="(0, 1]"))
    feature_spearman: float = field(default=0.8, metadata=doc(
        "prompt-level Spearman between the task feature a learned predictor sees and the true success "
        "(0: the feature is noise; a modelling assumption, see docs/strategies.md; calibrate_from fits it)",
        within="[0, 1]"))
    predictor_level_shift: float = field(default=0.0, metadata=doc(
        "logit offset added to the learned predictor's prompt predictions: a level error like a real predictor's "
        "(calibrate_from fits it to the bank bench's)", within="[-100, 100]"))
    warmup_prompts: int | None = field(default=None, metadata=doc(
        "simulated tasks held out of every candidate pool whose rollouts (grown as a bank records a prompt) train "
        "every learned predictor before step 0, as bench --bank does; unset: 0 (a cold start), or with "
        "calibrate_from the bank bench's (64, at most a quarter of the bank)", within=f"[0, {MAX_COUNT}]"))
    oracle_upper_bound: bool = field(default=True, metadata=doc(
        "also run TRACE with the oracle predictor, labelled as an upper bound"))
    budget_unit: str = field(default="nominal", metadata=doc(
        "what is equalised across strategies: nominal (M (1 + N/2)) | tokens (exact generated tokens)"))
    strategies: tuple[str, ...] = field(default=(), metadata=_STRATEGIES)
    plugins: tuple[str, ...] = field(default=(), metadata=_PLUGINS)
    deterministic: bool = section_default(Reproducibility, "deterministic", True)
    target_mixed: float = field(default=0.27, metadata=doc(
        "P(uniform group of G is mixed) to calibrate to", within="(0, 1)"))
    mean_success: float = field(default=0.5, metadata=doc("mean task success probability", within="(0, 1)"))
    step_concentration: float = field(default=3.0, metadata=doc(
        "kappa of the per-turn beta-splitting martingale", within="(0, 1000000]"))
    min_turns: int = field(default=3, metadata=doc("shortest simulated episode (turns)", within="[1, 1000]"))
    max_turns: int = field(default=6, metadata=doc("longest simulated episode (turns)", within="[1, 1000]"))
    turn_shares: tuple[float, ...] = field(default=(), metadata=doc(
        "per-episode lengths: the share of each length min_turns..max_turns among failed episodes (among every "
        "episode without success_turn_shares); each branch draws its own length given its outcome "
        "(trace_gym/sim/lengths.py). Empty: one length per task, uniform over min_turns..max_turns",
        within="[0, 1000000]"))
    success_turn_shares: tuple[float, ...] = field(default=(), metadata=doc(
        "with turn_shares: the share of each length min_turns..max_turns among successful episodes (at p = "
        "mean_success when success_turn_tilt is set)", within="[0, 1000000]"))
    success_turn_tilt: float = field(default=0.0, metadata=doc(
        "with turn_shares: how a task's success probability p moves its successful lengths, gamma in "
        "P(length l | success) ∝ share_l exp(-gamma (l - min_turns) (logit p - logit mean_success)) "
        "(trace_gym/sim/lengths.py; > 0: easier tasks succeed earlier). calibrate_from fits it where the bank's "
        "roots pay for it (BIC)", within="[-100, 100]"))
    type_shares: tuple[float, ...] = field(default=(), metadata=doc(
        "a prior of task types (trace_gym/sim/prior.py): each type's share of the tasks (summing to 1), with "
        "type_means and type_concentrations (its Beta's mean and a + b); empty: one Beta from target_mixed and "
        "mean_success. calibrate_from sets one per kind of a bank's task ids where the kinds explain its counts",
        within="(0, 1]"))
    type_means: tuple[float, ...] = field(default=(), metadata=doc(
        "with type_shares: each type's mean success probability", within="(0, 1)"))
    type_concentrations: tuple[float, ...] = field(default=(), metadata=doc(
        "with type_shares: each type's Beta concentration a + b (large: every task of the type alike)",
        within="(0, 10000000]"))
    type_visibility: float = field(default=1.0, metadata=doc(
        "with types: the probability that the learned predictor sees a task's own type (else a random one; "
        "calibrate_from fits it)", within="[0, 1]"))
    type_step_concentrations: tuple[float, ...] = field(default=(), metadata=doc(
        "with types: each type's own step_concentration (kappa); empty: every type takes step_concentration. "
        "calibrate_from fits one per type from the continuations of its kind", within="(0, 1000000]"))
    signal_noise: float = field(default=4.0, metadata=doc(
        "std (logit units) of the noise on what a learned predictor sees of a prefix's value after each turn "
        "(its signal: logit of the value + noise); calibrate_from fits it in the bench where random_tree runs, so "
        "that the prefix predictor reads the random tree arm's prefixes as well as the bank bench's",
        within="[0, 1000]"))
    prefix_sees_turn: bool = field(default=False, metadata=doc(
        "the learned predictor also sees a prefix's turn (one intercept per turn, as a model reading the prefix's "
        "text does); calibrate_from sets it"))
    prompts_alike: bool = field(default=False, metadata=doc(
        "the learned predictor sees no task feature: every prompt reads alike to it, as prompts of one text do to a "
        "bank's predictor; calibrate_from sets it where the bank predictor's prompt Spearman is undefined"))
    common_draws: bool = field(default=False, metadata=doc(
        "every arm of a repetition draws the same outcome for the same request (a task's n-th root, a prefix's "
        "k-th continuation), as a bank bench's arms replay the same recorded rollouts (trace_gym/sim/draws.py); "
        "false: each arm draws from its own stream. calibrate_from sets it"))
    prefixes_per_root: int = field(default=0, metadata=doc(
        "the prefixes of a root rollout a continuation may start from: 0, every one; n, only the n depths a bank "
        "recording with max_prefixes_per_root = n keeps (trace_gym/tree.py prefix_depths), the ones the bank "
        "bench can continue from (calibrate_from sets the bank's cap)", within=f"[0, {MAX_COUNT}]"))
    calibrate_from: str = field(default="", metadata=doc(
        "a rollout bank: set mean_success, target_mixed, step_concentration, min/max_turns, turn_shares and "
        "success_turn_shares (its roots' lengths by outcome; success_turn_tilt where they move with p), task "
        "types where its task kinds explain its counts (type_shares, type_means, type_concentrations, "
        "type_visibility, type_step_concentrations), "
        "prefixes_per_root (the bank's prefix cap), prefix_sees_turn, prompts_alike and common_draws (as the "
        "bank bench reads and pairs), and fit the learned predictor and its signal_noise "
        "(trace_gym/sim/calibrate.py, trace_gym/bench/sim_fit.py, trace_gym/bench/in_bench_fit.py), and print them"))
    demo_values: tuple[float, ...] = field(default=(0.99, 0.9, 0.5, 0.5, 0.15, 0.02), metadata=doc(
        "predicted values of the root-allocation demo", within="[0, 1]"))
    demo_budgets: tuple[int, ...] = field(default=(2, 4, 8, 12, 16, 24, 32, 48, 64), metadata=doc(
        "root budgets of the root-allocation demo", within=f"[2, {MAX_COUNT}]"))

    def __post_init__(self) -> None:
        check_sections(self)
        _check_measured_steps(self)
        if self.candidates > self.pool_size:
            raise ValueError(f"candidates {self.candidates} exceed pool_size {self.pool_size}")
        _check_sim_predictor(self)
        _check_unit(self)
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns!r}, {self.max_turns!r}")
        _check_lengths(self)


def _check_lengths(cfg: "SimBenchConfig") -> None:
    """The per-episode length and task-type keys (one line naming a bad value); a calibrated run's are
    the bank's."""
    from trace_gym.sim.lengths import check_lengths
    from trace_gym.sim.prior import check_types

    check_lengths(cfg.turn_shares, cfg.success_turn_shares, cfg.min_turns, cfg.max_turns)
    if cfg.success_turn_tilt and not len(cfg.turn_shares):
        raise ValueError(f"success_turn_tilt {cfg.success_turn_tilt!r} needs turn_shares (per-episode lengths)")
    check_types(cfg.type_shares, cfg.type_means, cfg.type_concentrations, cfg.type_visibility,
                cfg.type_step_concentrations)


def _check_sim_predictor(cfg: "SimBenchConfig") -> None:
    """The simulator's level-shift and warm-up keys beyond their ranges (one line naming a bad value)."""
    if cfg.predictor_level_shift and cfg.predictor != "learned":  # the other sim kinds: the truth, or it plus noise
        raise ValueError(f"predictor_level_shift is read by the learned predictor only, got "
                         f"predictor={cfg.predictor!r}")
    room = cfg.pool_size - cfg.candidates
    if cfg.warmup_prompts is not None and cfg.warmup_prompts > room:
        raise ValueError(f"warmup_prompts must be an integer in [0, pool_size - candidates = {room}], got "
                         f"{cfg.warmup_prompts!r}")


# ---------------------------------------------------------------------- bench --env
@dataclass(frozen=True)
class EnvBenchConfig(BudgetShape, AgentLimits, PredictorChoice, Reproducibility, BenchTarget):
    """``trace-gym bench --env ENV``: strategies on real rollouts of a real policy (no training).

    The default is sized for the 2-core CPU machine: SmolLM2-135M on generated math
    tasks, 24 candidates, M = 8 roots with N = 2 continuations each (nominal 16).
    """

    env: str = field(default="math_python", metadata=doc("env family short name or registered env id"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc("JSON object of keyword arguments for the env"))
    task_kwargs: dict = field(default_factory=dict, metadata=doc("JSON object of keyword arguments for the task loader"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, local HF folder, hub id or RUN[@STEP]"))
    engine: str = field(default="auto", metadata=doc("rollout engine: auto | hf | vllm"))
    seeds: int = field(default=1, metadata=doc("independent repetitions (fresh pools each)", within="[1, 10000]"))
    candidates: int = field(default=24, metadata=doc("candidate prompts per repetition", within=f"[1, {MAX_COUNT}]"))
    warmup_budget: int = field(default=16, metadata=doc(
        "rollouts of the predictor warm-up batch (0: none)", within=f"[0, {MAX_COUNT}]"))
    strategies: tuple[str, ...] = field(default=(), metadata=_STRATEGIES)
    plugins: tuple[str, ...] = field(default=(), metadata=_PLUGINS)
    deterministic: bool = section_default(Reproducibility, "deterministic", True)
    dump_episodes: int = field(default=0, metadata=doc(
        "write this many full transcripts per strategy (messages, actions, rewards) into --out",
        within=f"[0, {MAX_COUNT}]"))
    seed: int = field(default=0, metadata=doc("base seed (tasks, envs, sampling)", within=SEEDS))

    def __post_init__(self) -> None:
        check_sections(self)


# ---------------------------------------------------------------------- bench --bank
@dataclass(frozen=True)
class BankBenchConfig(BudgetShape, PredictorChoice, Reproducibility, BenchTarget):
    """``trace-gym bench --bank FILE``: strategies replayed on a recorded rollout bank.

    The default is sized for a bank of a few hundred prompts with R = 8 roots and K = 4
    continuations: 64 held-out prompts warm the predictor up, then 64 candidates and
    M = 16 roots per step, N = 2 continuations per root, over 3 measured steps: one pass
    over the 192 measurable prompts of a 256-prompt bank, so no prompt is drawn twice and
    the recorded roots never run out (a second pass needed 12 roots of some prompts);
    with the warm-up the per-step curve is flat from step 0 (docs/benchmarking.md).
    ``candidates`` and ``root_budget`` left unset (None) are sized to a smaller bank
    (:func:`trace_gym.bench.bank.bank_sizes`); a value given that the bank cannot hold is
    refused in one line naming the largest that fit.
    """

    bank: str = field(default="", metadata=doc("the rollout bank file (trace-gym bank record --out FILE)"))
    seeds: int = field(default=10, metadata=doc(
        "independent repetitions (fresh candidate draws and rollout draws)", within="[1, 10000]"))
    steps: int = field(default=3, metadata=doc(
        "allocation steps per repetition (a fresh candidate pool each)", within="[1, 100000]"))
    warmup_steps: int = field(default=0, metadata=doc(
        "first steps run (the predictor trains) but not measured", within="[0, 100000]"))
    warmup_prompts: int | None = field(default=None, metadata=doc(
        "prompts held out of every measured pool (a slice seeded by seed); their recorded rollouts train every "
        "learned predictor before step 0, charged to no arm (0: a cold start; default: 64, at most a quarter of "
        "the bank)", within=f"[0, {MAX_COUNT}]"))
    candidates: int | None = field(default=None, metadata=doc(
        "candidate prompts scored per step; unset: 64, or every prompt a smaller bank has left after the warm-up",
        within=f"[1, {MAX_COUNT}]"))
    root_budget: int | None = section_default(BudgetShape, "root_budget", None, help=(
        "M: root rollouts of a tree strategy per step; unset: 16, or the largest whose fixed groups of "
        "group_size a smaller bank's candidates hold"))
    oracle_upper_bound: bool = field(default=True, metadata=doc(
        "also run TRACE with the bank's empirical rates as its predictor, labelled as an upper bound"))
    embedding_cache: bool = field(default=True, metadata=doc(
        "keep the frozen encoder's embeddings of the bank's texts on disk under the trace_gym cache "
        "($TRACE_GYM_CACHE/embeddings/<bank checksum>), so the next run reads them (the same numbers; "
        "docs/benchmarking.md, Speed of a bank bench); false: embed afresh"))
    budget_unit: str = field(default="nominal", metadata=doc(
        "what is equalised across strategies: nominal (M (1 + N/2)) | tokens (the recorded generated tokens)"))
    strategies: tuple[str, ...] = field(default=(), metadata=_STRATEGIES)
    plugins: tuple[str, ...] = field(default=(), metadata=_PLUGINS)
    deterministic: bool = section_default(Reproducibility, "deterministic", True)
    seed: int = field(default=0, metadata=doc("base seed (candidate draws, rollout draws, predictors)", within=SEEDS))
    epochs: int = field(default=0, metadata=doc(
        "passes over the measured prompts (0: run `steps` steps): the steps become warmup_steps + ceil(epochs x "
        "measured prompts / candidates), each visit of a prompt drawing fresh recorded rollouts without "
        "replacement, so methods that read a prompt's history see it recur", within="[0, 1000]"))

    def __post_init__(self) -> None:
        check_sections(self)
        _check_measured_steps(self)
        _check_unit(self)


#: The bench keys a calibrated simulator copies from a bank bench's resolved config to run that bench's shape.
BANK_SHAPE_KEYS = ("candidates", "root_budget", "group_size", "continuations_per_root", "steps", "warmup_steps")


def sim_shape_overrides(bank_config: dict[str, Any], keys: tuple[str, ...] = BANK_SHAPE_KEYS) -> list[str]:
    """``key=value`` overrides that make ``bench --sim calibrate_from=BANK`` run the shape of the bank
    bench whose resolved config is ``bank_config``: its ``keys``, and its warm-up slice where that bench
    set one (unset, the calibration's warm-up is already the bank bench's default)."""
    warm = bank_config.get("warmup_prompts")
    return [f"{k}={bank_config[k]}" for k in keys] + ([f"warmup_prompts={warm}"] if warm is not None else [])
