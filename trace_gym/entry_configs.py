"""Every entry point's config, in one place: one frozen dataclass per command.

=================  ==========================  ==========================================
command            config                      sections (:mod:`trace_gym.config_sections`)
=================  ==========================  ==========================================
``bench --sim``    :class:`SimBenchConfig`     budget, predictor (reads the simulator),
                                               reproducibility
``bench --env``    :class:`EnvBenchConfig`     budget, agent, predictor, reproducibility
``bench --bank``   :class:`BankBenchConfig`    budget, predictor, reproducibility
``train``          :class:`TrainConfig`        budget, agent, predictor, reproducibility
                                               (+ ``trainer``)
``bank record``    :class:`BankRecordConfig`   agent (a bank's shape is R roots, K
                                               continuations, not a budget)
``eval``           ``evaluators.run.EvalConfig``  its own limits (0: the suite's default);
                                               it lives with the suites it validates
=================  ==========================  ==========================================

:data:`ENTRY_CONFIGS` lists them (``tests`` check that each takes the shared sections'
fields from the sections). Each field is a YAML key, a ``key=value`` override and a
``--key`` flag; :mod:`trace_gym.config` loads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trace_gym.config import doc
from trace_gym.config_sections import (AgentLimits, BenchTarget, BudgetShape, PredictorChoice, Reproducibility,
                                       check_sections, section_default)
from trace_gym.engines import ENGINES
from trace_gym.predictor import predictor_names, reads_a_model
from trace_gym.trainer import TrainerConfig

#: What a bench equalises across strategies: the nominal budget or the exact generated tokens.
BUDGET_UNITS = ("nominal", "tokens")

#: Every entry point: the command line -> ``module:class`` of its config.
ENTRY_CONFIGS: dict[str, str] = {
    "bench --sim": "trace_gym.entry_configs:SimBenchConfig",
    "bench --env": "trace_gym.entry_configs:EnvBenchConfig",
    "bench --bank": "trace_gym.entry_configs:BankBenchConfig",
    "train": "trace_gym.entry_configs:TrainConfig",
    "bank record": "trace_gym.entry_configs:BankRecordConfig",
    "eval": "evaluators.run:EvalConfig",
}


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)!r}")


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

    seeds: int = field(default=3, metadata=doc("independent seeds (a fresh task pool each)"))
    steps: int = field(default=5, metadata=doc("allocation steps per seed (a fresh candidate pool each)"))
    warmup_steps: int = field(default=1, metadata=doc("first steps run (the predictor trains) but not measured"))
    pool_size: int = field(default=4096, metadata=doc("simulated tasks in the dataset"))
    candidates: int = field(default=256, metadata=doc("candidate prompts scored per step"))
    root_budget: int = section_default(BudgetShape, "root_budget", 256)
    group_size: int = section_default(BudgetShape, "group_size", 8)
    predictor: str = section_default(PredictorChoice, "predictor", "learned", help=(
        "predictor of every predictor-driven strategy: " + " | ".join(predictor_names("sim"))))
    noisy_spearman: float = field(default=0.8, metadata=doc("prompt-level Spearman of the noisy oracle"))
    feature_spearman: float = field(default=0.8, metadata=doc(
        "prompt-level Spearman between the task feature a learned predictor sees and the true success, in [0, 1] "
        "(0: the feature is noise; a modelling assumption, see docs/strategies.md; calibrate_from fits it)"))
    predictor_level_shift: float = field(default=0.0, metadata=doc(
        "logit offset added to the learned predictor's prompt predictions: a level error like a real predictor's "
        "(calibrate_from fits it to the bank bench's)"))
    warmup_prompts: int | None = field(default=None, metadata=doc(
        "simulated tasks held out of every candidate pool whose rollouts (grown as a bank records a prompt) train "
        "every learned predictor before step 0, as bench --bank does; unset: 0 (a cold start), or with "
        "calibrate_from the bank bench's (64, at most a quarter of the bank)"))
    oracle_upper_bound: bool = field(default=True, metadata=doc(
        "also run TRACE with the oracle predictor, labelled as an upper bound"))
    budget_unit: str = field(default="nominal", metadata=doc(
        "what is equalised across strategies: nominal (M (1 + N/2)) | tokens (exact generated tokens)"))
    strategies: tuple[str, ...] = field(default=(), metadata=_STRATEGIES)
    plugins: tuple[str, ...] = field(default=(), metadata=_PLUGINS)
    deterministic: bool = section_default(Reproducibility, "deterministic", True)
    target_mixed: float = field(default=0.27, metadata=doc("P(uniform group of G is mixed) to calibrate to"))
    mean_success: float = field(default=0.5, metadata=doc("mean task success probability"))
    step_concentration: float = field(default=3.0, metadata=doc("kappa of the per-turn beta-splitting martingale"))
    min_turns: int = field(default=3, metadata=doc("shortest simulated episode (turns)"))
    max_turns: int = field(default=6, metadata=doc("longest simulated episode (turns)"))
    calibrate_from: str = field(default="", metadata=doc(
        "a rollout bank: set mean_success, target_mixed, step_concentration, min/max_turns and feature_spearman "
        "from its measurements (trace_gym/calibrate.py), and print them"))
    demo_values: tuple[float, ...] = field(
        default=(0.99, 0.9, 0.5, 0.5, 0.15, 0.02), metadata=doc("predicted values of the root-allocation demo"))
    demo_budgets: tuple[int, ...] = field(
        default=(2, 4, 8, 12, 16, 24, 32, 48, 64), metadata=doc("root budgets of the root-allocation demo"))

    def __post_init__(self) -> None:
        check_sections(self)
        _positive(self, "seeds", "steps", "pool_size", "candidates")
        _check_measured_steps(self)
        if self.candidates > self.pool_size:
            raise ValueError(f"candidates {self.candidates} exceed pool_size {self.pool_size}")
        if not 0 < self.noisy_spearman <= 1:
            raise ValueError(f"noisy_spearman must lie in (0, 1], got {self.noisy_spearman!r}")
        if not 0 <= self.feature_spearman <= 1:
            raise ValueError(f"feature_spearman must lie in [0, 1], got {self.feature_spearman!r}")
        _check_sim_predictor(self)
        _check_unit(self)
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns!r}, {self.max_turns!r}")


def _check_sim_predictor(cfg: "SimBenchConfig") -> None:
    """The simulator's warm-up and level-shift keys (one line naming a bad value)."""
    import math

    shift = cfg.predictor_level_shift
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not math.isfinite(shift):
        raise ValueError(f"predictor_level_shift must be a finite number (logit units), got {shift!r}")
    if shift and cfg.predictor != "learned":  # the other sim kinds are the truth, or the truth plus noise
        raise ValueError(f"predictor_level_shift is read by the learned predictor only, got "
                         f"predictor={cfg.predictor!r}")
    n = cfg.warmup_prompts
    room = cfg.pool_size - cfg.candidates
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= room):
        raise ValueError(f"warmup_prompts must be an integer in [0, pool_size - candidates = {room}], got {n!r}")


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
    seeds: int = field(default=1, metadata=doc("independent repetitions (fresh pools each)"))
    candidates: int = field(default=24, metadata=doc("candidate prompts per repetition"))
    warmup_budget: int = field(default=16, metadata=doc("rollouts of the predictor warm-up batch (0: none)"))
    strategies: tuple[str, ...] = field(default=(), metadata=_STRATEGIES)
    plugins: tuple[str, ...] = field(default=(), metadata=_PLUGINS)
    deterministic: bool = section_default(Reproducibility, "deterministic", True)
    dump_episodes: int = field(default=0, metadata=doc(
        "write this many full transcripts per strategy (messages, actions, rewards) into --out"))
    seed: int = field(default=0, metadata=doc("base seed (tasks, envs, sampling)"))

    def __post_init__(self) -> None:
        check_sections(self)
        _positive(self, "seeds", "candidates")
        if self.dump_episodes < 0 or self.warmup_budget < 0:
            raise ValueError(f"dump_episodes and warmup_budget must be >= 0, got {self.dump_episodes!r}, "
                             f"{self.warmup_budget!r}")


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
    (:func:`trace_gym.bench_bank.bank_sizes`); a value given that the bank cannot hold is
    refused in one line naming the largest that fit.
    """

    bank: str = field(default="", metadata=doc("the rollout bank file (trace-gym bank record --out FILE)"))
    seeds: int = field(default=10, metadata=doc("independent repetitions (fresh candidate draws and rollout draws)"))
    steps: int = field(default=3, metadata=doc("allocation steps per repetition (a fresh candidate pool each)"))
    warmup_steps: int = field(default=0, metadata=doc("first steps run (the predictor trains) but not measured"))
    warmup_prompts: int | None = field(default=None, metadata=doc(
        "prompts held out of every measured pool (a slice seeded by seed); their recorded rollouts train every "
        "learned predictor before step 0, charged to no arm (0: a cold start; default: 64, at most a quarter of "
        "the bank)"))
    candidates: int | None = field(default=None, metadata=doc(
        "candidate prompts scored per step; unset: 64, or every prompt a smaller bank has left after the warm-up"))
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
    seed: int = field(default=0, metadata=doc("base seed (candidate draws, rollout draws, predictors)"))
    epochs: int = field(default=0, metadata=doc(
        "passes over the measured prompts (0: run `steps` steps): the steps become warmup_steps + ceil(epochs x "
        "measured prompts / candidates), each visit of a prompt drawing fresh recorded rollouts without "
        "replacement, so methods that read a prompt's history see it recur"))

    def __post_init__(self) -> None:
        check_sections(self)
        _positive(self, "seeds", "steps", *(["candidates"] if self.candidates is not None else []))
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or not 0 <= self.epochs <= 1000:
            raise ValueError(f"epochs must be an integer in [0, 1000], got {self.epochs!r}")
        _check_measured_steps(self)
        _check_unit(self)


# ---------------------------------------------------------------------- train
@dataclass(frozen=True)
class TrainConfig(BudgetShape, AgentLimits, PredictorChoice, Reproducibility):
    """``trace-gym train``: one training run. Every field is a YAML key or a ``key=value``
    override; the ``trainer`` section (``trainer.lr=...``) holds the policy update's settings."""

    run_dir: str = field(default="runs/train", metadata=doc("run directory (config, metrics, checkpoints)"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, HF folder, hub id or RUN[@STEP] of the initial policy"))
    engine: str = field(default="hf", metadata=doc("rollout engine: " + " | ".join(["auto", *ENGINES])))
    engine_kwargs: dict = field(default_factory=dict, metadata=doc(
        "keyword arguments of the engine (e.g. {dtype: bfloat16, gpu_memory_utilization: 0.4})"))
    device: str = field(default="auto", metadata=doc("trainer device: auto | cpu | cuda"))
    env: str = field(default="math_python", metadata=doc("env family or registered env id (trace-gym envs)"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc("extra env keyword arguments (over the family's)"))
    data: str = field(default="", metadata=doc(
        "training data: empty for the env family's own tasks, else a dataset name (e.g. deepscaler)"))
    data_path: str = field(default="", metadata=doc("local file or folder of `data` (empty: the hub)"))
    heldout_fraction: float = field(default=0.2, metadata=doc(
        "share of the family's prompts (by prompt hash) kept out of training for held-out evaluation"))
    train_pool: int = field(default=512, metadata=doc("training prompts drawn from the data"))
    strategy: str = field(default="trace", metadata=doc("rollout allocation strategy (trace-gym strategies)"))
    advantage: str = field(default="treerpo", metadata=doc(
        "advantage estimator: one of the estimator table (trace-gym train --help lists it; plugins may add more)"))
    advantage_std_normalize: bool = field(default=True, metadata=doc("divide by the group std (false: Dr. GRPO)"))
    advantage_eps: float = field(default=1e-6, metadata=doc("epsilon added to group stds"))
    steps: int = field(default=4, metadata=doc("training steps (policy updates)"))
    seed: int = field(default=0, metadata=doc("base seed (data order, sampling, envs, allocation)"))
    candidates: int = field(default=16, metadata=doc("candidate prompts scored per step"))
    critic_model: str = field(default="", metadata=doc(
        "the lm_critic's backbone: a known name, folder or hub id (empty: the policy; the paper: a 0.6B critic)"))
    allow_cpu_critic: bool = field(default=False, metadata=doc(
        "let an lm_critic run on the CPU beside a CUDA policy (refused otherwise: it would be slow)"))
    eval_every: int = field(default=0, metadata=doc("evaluate every K steps and at the end (0: never)"))
    eval_at_start: bool = field(default=False, metadata=doc("also evaluate the initial policy (step 0)"))
    eval_suite: str = field(default="generated", metadata=doc("suite evaluated during training"))
    eval_tasks: int = field(default=32, metadata=doc("tasks of the suite evaluated during training"))
    eval_samples: int = field(default=1, metadata=doc("samples per task during training evaluations"))
    checkpoint_every: int = field(default=1, metadata=doc("checkpoint every K steps (and at the last step)"))
    keep_checkpoints: int = field(default=2, metadata=doc(
        "newest checkpoints kept (0: all); only the newest keeps the optimiser state, the others weights only"))
    keep_final_state: bool = field(default=True, metadata=doc(
        "keep the last step's optimiser, predictor and RNG state, so a rerun with more steps resumes exactly "
        "(false: a finished run keeps weights only, a third of the size)"))
    ray: str | None = field(default=None, metadata=doc(
        "run the same loop on Ray actors: null (in process), local (start a local cluster) or a cluster address"))
    ray_options: dict = field(default_factory=dict, metadata=doc(
        "Ray sizing: rollout_workers, env_pools, trainer_workers, ... (docs/distributed.md)"))
    report_to: tuple[str, ...] = field(default=(), metadata=doc(
        "also log each step's scalars to: tensorboard | wandb | mlflow (comma-separated; offline, in run_dir)"))
    tensorboard: bool = field(default=False, metadata=doc("also write TensorBoard scalars to run_dir/tb "
                                                          "(= report_to: tensorboard)"))
    progress: bool = field(default=True, metadata=doc("progress bars and a one-line summary per step"))
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata=doc("policy update settings"))

    def __post_init__(self) -> None:
        from trace_gym.advantages import ESTIMATORS

        check_sections(self)
        _positive(self, "steps", "candidates", "train_pool", "checkpoint_every", "eval_tasks", "eval_samples")
        if self.engine not in ("auto", *ENGINES):
            raise ValueError(f"engine must be one of {['auto', *ENGINES]}, got {self.engine!r}")
        if self.advantage not in ESTIMATORS:
            from trace_gym.suggest import did_you_mean

            raise ValueError(f"advantage must be one of {sorted(ESTIMATORS)}, got {self.advantage!r}"
                             f"{did_you_mean(self.advantage, ESTIMATORS)}")
        from trace_gym.reporters import check_reporter_names

        check_reporter_names(self.report_to)
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must lie in [0, 1), got {self.heldout_fraction!r}")
        if self.eval_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("eval_every and keep_checkpoints must be >= 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if reads_a_model(self.predictor) and self.device == "cuda" and not self.allow_cpu_critic \
                and str(self.predictor_kwargs.get("device", "cpu")).startswith("cpu"):
            raise ValueError(f"predictor {self.predictor} would run on the CPU beside a CUDA policy (predictor_kwargs "
                             "has no device: cuda); set predictor_kwargs.device: cuda, or allow_cpu_critic: true")
        if self.trainer.loss_aggregation == "seq-mean-token-sum-norm" and not self.trainer.loss_norm_tokens:
            # Dr. GRPO's constant: the most policy tokens one sequence can have in this run
            object.__setattr__(self, "trainer", dataclasses.replace(
                self.trainer, loss_norm_tokens=min(self.max_turns * self.max_turn_tokens, self.max_episode_tokens)))


#: Keys a rerun may change without starting a new run.
RESUMABLE_KEYS = frozenset({"progress", "tensorboard", "report_to", "keep_checkpoints", "keep_final_state", "eval_every",
                            "steps", "ray", "ray_options"})


# ---------------------------------------------------------------------- bank record
@dataclass(frozen=True)
class BankRecordConfig(AgentLimits):
    """``trace-gym bank record``: record a rollout bank from a real policy."""

    out: str = field(default="runs/bank.jsonl.gz", metadata=doc("the bank file (.jsonl.gz); an existing one resumes"))
    env: str = field(default="math_python", metadata=doc("env family or registered env id (trace-gym envs)"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc("extra env keyword arguments"))
    task_kwargs: dict = field(default_factory=dict, metadata=doc("extra task-loader keyword arguments"))
    data: str = field(default="", metadata=doc("prompts: empty for the env family's own tasks, else a training "
                                               "dataset name (e.g. deepscaler, hotpotqa, bfcl)"))
    data_path: str = field(default="", metadata=doc("local file or folder of `data` (empty: the hub)"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, local HF folder, hub id or RUN[@STEP]"))
    engine: str = field(default="auto", metadata=doc("rollout engine: auto | hf | vllm"))
    engine_kwargs: dict = field(default_factory=dict, metadata=doc("keyword arguments of the engine"))
    prompts: int = field(default=256, metadata=doc("P: prompts recorded"))
    roots: int = field(default=8, metadata=doc("R: root rollouts per prompt"))
    continuations: int = field(default=4, metadata=doc("K: continuations per recorded prefix"))
    max_prefixes_per_root: int = field(default=0, metadata=doc(
        "cap on the prefixes recorded per root, evenly spaced over its turns (0: every prefix)"))
    max_turn_tokens: int = section_default(AgentLimits, "max_turn_tokens", 96)
    seed: int = field(default=0, metadata=doc("task seed and base of the env and sampling seeds"))
    batch_prompts: int = field(default=8, metadata=doc("prompts in flight at once (memory: one batch)"))
    progress: bool = field(default=True, metadata=doc("progress bar with prompts/min and ETA (false: a line per "
                                                        "prompt written)"))

    def __post_init__(self) -> None:
        check_sections(self)
        _positive(self, "prompts", "roots", "batch_prompts")
        if self.roots < 2:
            raise ValueError(f"roots must be >= 2 (a group of one has no contrast), got {self.roots!r}")
        if self.continuations < 0 or self.max_prefixes_per_root < 0:
            raise ValueError("continuations and max_prefixes_per_root must be >= 0")
        if not self.out.endswith(".jsonl.gz"):
            raise ValueError(f"out must end with .jsonl.gz (a gzip'd JSON-lines bank), got {self.out!r}")
