"""``trace-gym train``'s config: :class:`TrainConfig`, and the keys a rerun may change.

Sections (:mod:`trace_gym.config_sections`): budget, agent, predictor, reproducibility, and
its own ``trainer`` section (:class:`~trace_gym.train.trainer.TrainerConfig`). Each field is a
YAML key, a ``key=value`` override and a ``--key`` flag; :mod:`trace_gym.config` loads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trace_gym.config import doc
from trace_gym.config_sections import AgentLimits, BudgetShape, PredictorChoice, Reproducibility, check_sections
from trace_gym.engines import ENGINES
from trace_gym.env.datafiles import HELDOUT_FRACTION
from trace_gym.predictor.kinds import reads_a_model
from trace_gym.train.trainer import TrainerConfig
from trace_gym.utils.config_fields import MAX_COUNT, SEEDS


@dataclass(frozen=True)
class TrainConfig(BudgetShape, AgentLimits, PredictorChoice, Reproducibility):
    """``trace-gym train``: one training run. Every field is a YAML key or a ``key=value``
    override; the ``trainer`` section (``trainer.lr=...``) holds the policy update's settings."""

    run_dir: str = field(default="runs/train", metadata=doc(
        "run directory (config, metrics, checkpoints)", output="folder"))
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
    heldout_fraction: float = field(default=HELDOUT_FRACTION, metadata=doc(
        "share of the family's prompts (by prompt hash) kept out of training for held-out evaluation",
        within="[0, 1)"))
    train_pool: int = field(default=512, metadata=doc("training prompts drawn from the data", within="[1, 10000000]"))
    strategy: str = field(default="trace", metadata=doc("rollout allocation strategy (trace-gym strategies)"))
    advantage: str = field(default="treerpo", metadata=doc(
        "advantage estimator: one of the estimator table (trace-gym train --help lists it; plugins may add more)"))
    advantage_std_normalize: bool = field(default=True, metadata=doc("divide by the group std (false: Dr. GRPO)"))
    advantage_eps: float = field(default=1e-6, metadata=doc("epsilon added to group stds", within="[0, 1]"))
    steps: int = field(default=4, metadata=doc("training steps (policy updates)", within="[1, 10000000]"))
    seed: int = field(default=0, metadata=doc("base seed (data order, sampling, envs, allocation)", within=SEEDS))
    candidates: int = field(default=16, metadata=doc("candidate prompts scored per step", within=f"[1, {MAX_COUNT}]"))
    critic_model: str = field(default="", metadata=doc(
        "the lm_critic's backbone: a known name, folder or hub id (empty: the policy; the paper: a 0.6B critic)"))
    allow_cpu_critic: bool = field(default=False, metadata=doc(
        "let an lm_critic run on the CPU beside a CUDA policy (refused otherwise: it would be slow)"))
    eval_every: int = field(default=0, metadata=doc(
        "evaluate every K steps and at the end (0: never)", within="[0, 10000000]"))
    eval_at_start: bool = field(default=False, metadata=doc("also evaluate the initial policy (step 0)"))
    eval_suite: str = field(default="generated", metadata=doc("suite evaluated during training"))
    eval_tasks: int = field(default=32, metadata=doc(
        "tasks of the suite evaluated during training", within=f"[1, {MAX_COUNT}]"))
    eval_samples: int = field(default=1, metadata=doc(
        "samples per task during training evaluations", within="[1, 10000]"))
    checkpoint_every: int = field(default=1, metadata=doc(
        "checkpoint every K steps (and at the last step)", within="[1, 10000000]"))
    keep_checkpoints: int = field(default=2, metadata=doc(
        "newest checkpoints kept (0: all); only the newest keeps the optimiser state, the others weights only",
        within=f"[0, {MAX_COUNT}]"))
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
        from trace_gym.train.advantages import ESTIMATORS

        check_sections(self)
        if self.engine not in ("auto", *ENGINES):
            raise ValueError(f"engine must be one of {['auto', *ENGINES]}, got {self.engine!r}")
        if self.advantage not in ESTIMATORS:
            from trace_gym.utils.suggest import did_you_mean

            raise ValueError(f"advantage must be one of {sorted(ESTIMATORS)}, got {self.advantage!r}"
                             f"{did_you_mean(self.advantage, ESTIMATORS)}")
        from trace_gym.runs.reporters import check_reporter_names

        check_reporter_names(self.report_to)
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
