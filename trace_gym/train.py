"""The training loop, top to bottom (trace-method.md, "One training step"), and its config.

:func:`train` reads like CleanRL's ``ppo.py``: per step it samples candidate prompts,
runs the one step driver on them (``rollout.collect``: rollout trees with the strategy,
then the success predictor's update on the trees), computes advantages with the chosen
estimator, updates the policy (:class:`~trace_gym.trainer.PolicyTrainer`), pushes
the weights to the rollout engine, logs one metrics line, checkpoints, and evaluates
every ``eval_every`` steps. Strategies, environments and estimators arrive as objects
(:class:`TrainSetup`) or through the estimator table, and the trainer, engine and agent
runners come from one backend object (:class:`~trace_gym.backend.TrainBackend`: in
process, or on Ray); the loop never branches on a name.

The face (the ``trace-gym train`` command) resolves names into a :class:`TrainSetup`;
this module imports nothing of the face or of the env families.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_gym.advantages import ESTIMATORS, get_estimator
from trace_gym.checkpoint import RunDir, load_predictor_state, predictor_state, require_predictor_state
from trace_gym.config import doc, flatten, load_config, to_yaml
from trace_gym.driver import forecast_fallback_first
from trace_gym.engines import ENGINES
from trace_gym.predictor import check_predictor_name, predictor_names
from trace_gym.trainer import TrainerConfig
from trace_gym.types import Task


@dataclass(frozen=True)
class TrainConfig:
    """``trace-gym train``: one training run. Every field is a YAML key or a ``key=value``
    override; the ``trainer`` section (``trainer.lr=...``) holds the policy update's settings."""

    run_dir: str = field(default="runs/train", metadata=doc("run directory (config, metrics, checkpoints)"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, HF folder, hub id or RUN[@STEP]"))
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
    root_budget: int = field(default=8, metadata=doc("M: root rollouts per step of a tree strategy"))
    continuations_per_root: int = field(default=2, metadata=doc("N: continuations per root; budget M (1 + N/2)"))
    group_size: int = field(default=4, metadata=doc("G: group size of fixed-group strategies (uniform, pcl)"))
    predictor: str = field(default="embedding", metadata=doc("success predictor: " + " | ".join(predictor_names("text"))))
    predictor_kwargs: dict = field(default_factory=dict, metadata=doc(
        "JSON object of the predictor's keyword arguments, e.g. {\"device\": \"cuda\", \"dtype\": \"bfloat16\"}"))
    critic_model: str = field(default="", metadata=doc(
        "the lm_critic's backbone: a known name, folder or hub id (empty: the policy; the paper: a 0.6B critic)"))
    allow_cpu_critic: bool = field(default=False, metadata=doc(
        "let an lm_critic run on the CPU beside a CUDA policy (refused otherwise: it would be slow)"))
    prefix_share: float = field(default=0.06, metadata=doc("share of the predictor's batch weight on prefix samples"))
    max_turns: int = field(default=3, metadata=doc("turns per episode"))
    max_turn_tokens: int = field(default=160, metadata=doc("generated tokens per turn"))
    max_episode_tokens: int = field(default=1024, metadata=doc("context limit per episode, tokens"))
    temperature: float = field(default=1.0, metadata=doc("rollout sampling temperature"))
    eval_every: int = field(default=0, metadata=doc("evaluate every K steps and at the end (0: never)"))
    eval_at_start: bool = field(default=False, metadata=doc("also evaluate the initial policy (step 0)"))
    eval_suite: str = field(default="generated", metadata=doc("suite evaluated during training"))
    eval_tasks: int = field(default=32, metadata=doc("tasks of the suite evaluated during training"))
    eval_samples: int = field(default=1, metadata=doc("samples per task during training evaluations"))
    checkpoint_every: int = field(default=1, metadata=doc("checkpoint every K steps (and at the last step)"))
    keep_checkpoints: int = field(default=2, metadata=doc("newest checkpoints kept (0: all)"))
    ray: str | None = field(default=None, metadata=doc(
        "run the same loop on Ray actors: null (in process), local (start a local cluster) or a cluster address"))
    ray_options: dict = field(default_factory=dict, metadata=doc(
        "Ray sizing: rollout_workers, env_pools, trainer_workers, ... (docs/distributed.md)"))
    tensorboard: bool = field(default=False, metadata=doc("also write TensorBoard scalars to run_dir/tb"))
    progress: bool = field(default=True, metadata=doc("progress bars and a one-line summary per step"))
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata=doc("policy update settings"))

    def __post_init__(self) -> None:
        for name in ("steps", "candidates", "group_size", "max_turns", "max_turn_tokens", "max_episode_tokens",
                     "train_pool", "checkpoint_every", "eval_tasks", "eval_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.root_budget < 2 or self.continuations_per_root < 0:
            raise ValueError(f"need root_budget >= 2 and continuations_per_root >= 0, got "
                             f"{self.root_budget!r}, {self.continuations_per_root!r}")
        if self.engine not in ("auto", *ENGINES):
            raise ValueError(f"engine must be one of {['auto', *ENGINES]}, got {self.engine!r}")
        if self.advantage not in ESTIMATORS:
            from trace_gym.config import did_you_mean

            raise ValueError(f"advantage must be one of {sorted(ESTIMATORS)}, got {self.advantage!r}"
                             f"{did_you_mean(self.advantage, ESTIMATORS)}")
        check_predictor_name(self.predictor, "text")
        if not 0 <= self.heldout_fraction < 1 or not 0 <= self.prefix_share < 1:
            raise ValueError(f"heldout_fraction and prefix_share must lie in [0, 1), got "
                             f"{self.heldout_fraction!r}, {self.prefix_share!r}")
        if self.temperature < 0 or self.eval_every < 0 or self.keep_checkpoints < 0:
            raise ValueError("temperature, eval_every and keep_checkpoints must be >= 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.predictor == "lm_critic" and self.device == "cuda" and not self.allow_cpu_critic \
                and str(self.predictor_kwargs.get("device", "cpu")).startswith("cpu"):
            raise ValueError("predictor lm_critic would run on the CPU beside a CUDA policy (predictor_kwargs has no "
                             "device: cuda); set predictor_kwargs.device: cuda, or allow_cpu_critic: true")
        if self.trainer.loss_aggregation == "seq-mean-token-sum-norm" and not self.trainer.loss_norm_tokens:
            # Dr. GRPO's constant: the most policy tokens one sequence can have in this run
            import dataclasses

            object.__setattr__(self, "trainer", dataclasses.replace(
                self.trainer, loss_norm_tokens=min(self.max_turns * self.max_turn_tokens, self.max_episode_tokens)))

    @property
    def nominal_budget(self) -> float:
        from trace_gym.budget import nominal_cost

        return nominal_cost(self.root_budget, self.continuations_per_root)


#: Keys a rerun may change without starting a new run.
RESUMABLE_KEYS = frozenset({"progress", "tensorboard", "keep_checkpoints", "eval_every", "steps", "ray", "ray_options"})


def load_train_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """YAML (``path``) then ``key=value`` overrides (``trainer.x`` keys reach the trainer
    section): :func:`trace_gym.config.load_config` for :class:`TrainConfig`."""
    return load_config(TrainConfig, path, overrides)


def config_differences(stored_yaml: str, new_yaml: str) -> list[str]:
    """Keys whose values differ between two resolved configs, ignoring :data:`RESUMABLE_KEYS`.

    A key one side lacks (a run written before the key existed) counts as its default, so
    a run resumes under a newer version as long as it leaves the new keys at their defaults.
    """
    import yaml

    def flat(text: str) -> dict:
        return flatten(TrainConfig, yaml.safe_load(text) or {})

    defaults = flat(to_yaml(TrainConfig()))
    flat_a, flat_b = {**defaults, **flat(stored_yaml)}, {**defaults, **flat(new_yaml)}
    return [f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}" for k in sorted(set(flat_a) | set(flat_b))
            if k not in RESUMABLE_KEYS and flat_a.get(k) != flat_b.get(k)]


class TaskCursor:
    """Walks a task pool in seeded epochs (a fresh permutation each epoch); resumable."""

    def __init__(self, size: int, seed: int):
        if size < 1:
            raise ValueError("the training task pool is empty")
        self.size, self.seed, self.epoch, self.position = size, seed, 0, 0

    def _order(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.size)

    def take(self, n: int) -> list[int]:
        """The next ``n`` indices (wrapping into the next epoch as needed)."""
        out: list[int] = []
        while len(out) < n:
            order = self._order()
            chunk = order[self.position: self.position + n - len(out)]
            out.extend(int(i) for i in chunk)
            self.position += len(chunk)
            if self.position >= self.size:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load(self, state: Mapping[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@dataclass
class TrainSetup:
    """The resolved objects a run needs (the face builds it from the config's names).

    Attributes:
        strategy: root allocator + prefix allocator + budget shape (``budget_split``).
        make_env: zero-argument factory of fresh envs.
        load_train_tasks: returns the training prompts (held-out prompts already removed).
        evaluate: ``(engine, step) -> metrics`` run every ``eval_every`` steps, or ``None``.
        data_offline: whether ``load_train_tasks`` works without network (``--dry-run``
            loads the tasks only then).
        describe: name -> one line, printed by ``--dry-run``.
    """

    strategy: Any
    make_env: Callable[[], Any]
    load_train_tasks: Callable[[], Sequence[Task]]
    evaluate: Callable[[Any, int], dict] | None = None
    data_offline: bool = True
    describe: dict[str, str] = field(default_factory=dict)


def tensorboard_writer(cfg: TrainConfig, logdir: Path | None) -> Any:
    """A TensorBoard writer on ``logdir`` when ``cfg.tensorboard`` (``None`` without a
    ``logdir``: only checks that the package imports), else ``None``."""
    if not cfg.tensorboard:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ValueError(f"tensorboard=true needs the tensorboard package (pip install tensorboard): {exc}") from None
    return SummaryWriter(str(logdir)) if logdir is not None else None


# ---------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, setup: TrainSetup, *, out: Any = None, backend: Any = None) -> dict[str, Any]:
    """Run (or resume) training; returns ``{"run_dir", "steps", "metrics": [...]}``.

    ``backend`` (a :class:`~trace_gym.backend.TrainBackend`) builds the trainer, the engine
    and each step's agent runner; default: :func:`~trace_gym.backend.backend_for` ``cfg``
    (in process, or on Ray when ``cfg.ray`` is set), built only once there is a step to
    run. The engine, the backend (a given one too) and the TensorBoard writer are closed
    on every way out: a finished run, one with nothing left to do, a refused resume, an
    exception mid-step; one of them failing to close does not keep the others open.
    """
    import contextlib

    from tqdm.auto import tqdm

    from trace_gym import checkpoint
    from trace_gym.backend import backend_for
    from trace_gym.models import quiet_third_party, resolve_model

    quiet_third_party()
    out = out or sys.stdout
    say = lambda msg: tqdm.write(msg, file=out) if cfg.progress else None  # noqa: E731
    with contextlib.ExitStack() as closing:
        if backend is not None:
            closing.callback(backend.close)
        tasks = list(setup.load_train_tasks())[: cfg.train_pool]  # data and policy before the run dir exists
        base_policy = resolve_model(cfg.policy)
        run = RunDir(cfg.run_dir, step_files=checkpoint.TRAINING_STEP_FILES)
        closing.callback(run.close)
        resume = run.start(to_yaml(cfg), compare=config_differences)
        for skipped in run.skipped:
            print(f"warning: {cfg.run_dir}: skipped checkpoint {skipped}", file=sys.stderr)
        start = resume.step if resume else 0
        if start >= cfg.steps:
            say(f"{cfg.run_dir}: all {cfg.steps} steps are done")
            return {"run_dir": cfg.run_dir, "steps": start, "metrics": run.read_metrics()}
        weights = resume.policy_path if resume else base_policy
        if backend is None:
            backend = backend_for(cfg)
            closing.callback(backend.close)
        trainer = backend.make_trainer(weights, cfg.trainer, total_steps=cfg.steps, temperature=cfg.temperature,
                                       device=cfg.device, seed=cfg.seed)
        engine = backend.make_engine(cfg.engine, weights, **cfg.engine_kwargs)
        closing.callback(engine.close)
        writer = tensorboard_writer(cfg, run.path / "tb")
        if writer is not None:
            closing.callback(writer.close)
        _loop(cfg, setup, run, resume, tasks, str(base_policy), trainer, engine, backend, writer, say, out)
    return {"run_dir": cfg.run_dir, "steps": cfg.steps, "metrics": run.read_metrics()}


def _loop(cfg: TrainConfig, setup: TrainSetup, run: RunDir, resume: Any, tasks: Sequence[Task], base_policy: str,
          trainer: Any, engine: Any, backend: Any, writer: Any, say: Callable, out: Any) -> None:
    """Steps ``start + 1 .. cfg.steps``, top to bottom."""
    import torch
    from tqdm.auto import tqdm

    from trace_gym.models import resolve_model
    from trace_gym.predictor import make_predictor

    start = resume.step if resume else 0
    critic = str(resolve_model(cfg.critic_model)) if cfg.critic_model and cfg.predictor == "lm_critic" else base_policy
    predictor = make_predictor(cfg.predictor, cfg.predictor_kwargs, model_path=critic, seed=cfg.seed)
    require_predictor_state(predictor)  # before step 1, not at the first checkpoint
    cursor = TaskCursor(len(tasks), cfg.seed)
    rng = np.random.default_rng([cfg.seed, 1])
    fallback_first = False  # the single-turn forecast (driver.forecast_fallback_first), kept in state.json
    if resume:
        trainer.load_state(resume.path)
        load_predictor_state(predictor, torch.load(resume.path / "predictor.pt", weights_only=False))
        fallback_first = _load_rng(resume.path, cursor, rng)
        trainer.sync_weights(engine, version=start)  # the engine serves the checkpoint's weights
        say(f"resuming {cfg.run_dir} after step {start}")
    if setup.evaluate is not None and cfg.eval_at_start and not (run.path / "evals" / "step-0.json").exists():
        evaluation = setup.evaluate(engine, 0)  # before any update: the initial policy
        (run.path / "evals").mkdir(exist_ok=True)
        (run.path / "evals" / "step-0.json").write_text(json.dumps(evaluation, default=str))
        say(f"step 0 (initial policy): held-out accuracy {evaluation.get('accuracy', math.nan):.3f}")
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.strategy}", disable=not cfg.progress,
               dynamic_ncols=True, file=out)
    for step in range(start + 1, cfg.steps + 1):
        t_step = time.perf_counter()
        # 1. sample candidate prompts
        candidates = [tasks[i] for i in cursor.take(cfg.candidates)]
        batch, token_trees, update, sync_seconds = policy_step(
            cfg, setup, candidates, step, predictor, trainer, engine, backend, rng, bar.set_postfix_str,
            fallback_first=fallback_first)
        fallback_first = forecast_fallback_first(batch)
        if batch.learning.warning:  # all 0 or all 1: no contrast, nothing to learn
            tqdm.write(f"WARNING: step {step}: {batch.learning.warning}", file=sys.stderr)
        # 7. evaluate every K steps (and at the end)
        evaluation, eval_seconds = None, 0.0
        if setup.evaluate is not None and cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            bar.set_postfix_str("eval")
            t_eval = time.perf_counter()
            evaluation = setup.evaluate(engine, step)
            eval_seconds = time.perf_counter() - t_eval
            (run.path / "evals").mkdir(exist_ok=True)
            (run.path / "evals" / f"step-{step}.json").write_text(json.dumps(evaluation, default=str))
        # 8. log and checkpoint (atomic; the metrics line is appended after the checkpoint)
        record = step_record(step, batch, update, batch.learning.stats, sync_seconds, evaluation,
                             time.perf_counter() - t_step, token_trees, eval_seconds)
        checkpoint = step % cfg.checkpoint_every == 0 or step == cfg.steps
        bar.set_postfix_str("checkpoint" if checkpoint else "")
        run.commit(step, record, (lambda folder: _write_checkpoint(folder, step, trainer, predictor, cursor, rng,
                                                                   fallback_first))
                   if checkpoint else None, keep=cfg.keep_checkpoints)
        if writer is not None:
            for key, value in _scalars(record).items():
                writer.add_scalar(key, value, step)
        bar.update(1)
        say(summary_line(record, cfg.steps))
    bar.close()


def policy_step(cfg: TrainConfig, setup: TrainSetup, candidates: Sequence[Task], step: int, predictor: Any,
                trainer: Any, engine: Any, backend: Any, rng: np.random.Generator,
                status: Callable[[str], Any] = lambda phase: None, *,
                fallback_first: bool = False) -> tuple[Any, list, dict[str, float], float]:
    """Steps 2-6 of one training step, as the loop runs them (and benchmarks/bench_step.py
    times them): rollout trees and the predictor's update on them, advantages, the policy
    update, the weight sync. ``status`` hears the phase names as they start;
    ``fallback_first`` as :func:`trace_gym.driver.run_step`.

    Returns ``(batch, token_trees, update metrics, weight-sync seconds)``.
    """
    from trace_gym.agent import AgentConfig
    from trace_gym.batches import token_tree
    from trace_gym.rollout import collect
    from trace_gym.types import SamplingParams

    # 2-3. the one step: rollout trees (predictor scoring, root allocation, prefix
    #      expansion), then the predictor's update on their recursive-mean targets
    status("rollouts")
    sampling = SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature,
                              seed=cfg.seed * 1_000_003 + step)
    agent_cfg = AgentConfig(max_turn_tokens=cfg.max_turn_tokens, max_episode_tokens=cfg.max_episode_tokens,
                            max_turns=cfg.max_turns)
    runner = backend.make_runner(engine, engine.tokenizer, setup.make_env, sampling, agent_cfg)
    try:
        batch = collect(candidates, setup.strategy, predictor, runner, cfg.nominal_budget, rng,
                        seed=cfg.seed * 1_000_003 + 100_000 * step, prefix_share=cfg.prefix_share,
                        fallback_first=fallback_first)
    finally:
        runner.close()
    # 4. advantages, per tree (pure functions over the trees)
    estimator = get_estimator(cfg.advantage)
    advantages = [estimator(t, eps=cfg.advantage_eps, std_normalize=cfg.advantage_std_normalize)
                  if t.leaves() else {} for t in batch.trees]  # a tree whose roots all failed: nothing
    # 5. policy update (PPO-clip on packed trees, each edge once, on the trainer's own threads)
    status("policy update")
    token_trees = [token_tree(t, a) for t, a in zip(batch.trees, advantages)]
    update = trainer.step(token_trees)
    # 6. weight sync to the rollout engine (version-checked)
    sync_seconds = trainer.sync_weights(engine, version=step)
    return batch, token_trees, update, sync_seconds


def _finite(value: Any) -> Any:
    """NaN / inf -> None, recursively, so metrics lines are strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _write_checkpoint(folder: Path, step: int, trainer: Any, predictor: Any, cursor: TaskCursor,
                      rng: np.random.Generator, fallback_first: bool = False) -> None:
    import torch

    trainer.save(folder)
    torch.save(predictor_state(predictor), folder / "predictor.pt")
    torch.save({"generator": rng.bit_generator.state, "python": random.getstate(),
                "numpy": np.random.get_state(), "torch": torch.get_rng_state()}, folder / "rng.pt")
    (folder / "state.json").write_text(json.dumps({"step": step, "cursor": cursor.state(),
                                                   "fallback_first": bool(fallback_first)}))


def _load_rng(folder: Path, cursor: TaskCursor, rng: np.random.Generator) -> bool:
    """Restore the cursor and every RNG from a checkpoint; returns its single-turn forecast."""
    import torch

    from trace_gym.run_files import read_state

    state = read_state(folder, int(folder.name.split("-")[1]))  # bounded and checked (verified at start too)
    cursor.load(state["cursor"])
    saved = torch.load(folder / "rng.pt", weights_only=False)
    rng.bit_generator.state = saved["generator"]
    random.setstate(saved["python"])
    np.random.set_state(saved["numpy"])
    torch.set_rng_state(saved["torch"])
    return bool(state.get("fallback_first", False))


# ---------------------------------------------------------------------- metrics
def step_record(step: int, batch: Any, update: Mapping[str, float], predictor_stats: Mapping[str, Any],
                sync_seconds: float, evaluation: Mapping[str, Any] | None, seconds: float,
                token_trees: Sequence[Any], eval_seconds: float = 0.0) -> dict[str, Any]:
    """One ``metrics.jsonl`` line (see ``docs/training.md`` for every field)."""
    from trace_gym import report

    trees, led = batch.trees, batch.ledger
    leaves = [leaf for t in trees for leaf in t.leaves()]
    chosen = np.flatnonzero(batch.root_counts)
    prompt_rho = report.spearman(batch.values[chosen], [t.targets(outcomes=True).get(0, math.nan) for t in trees]) \
        if len(trees) > 2 else math.nan
    pred, emp = [], []
    for ti, node, value in batch.prefix_predictions:
        target = trees[ti].targets(outcomes=True).get(node)
        if target is not None:
            pred.append(value)
            emp.append(target)
    cached = sum(int(n.info.get("cached_tokens") or 0) for t in trees for n in t.nodes[1:])
    phases = dict(led.seconds)
    phases["policy_update"] = float(update.get("seconds", 0.0))
    phases["weight_sync"] = float(sync_seconds)
    if evaluation is not None:
        phases["eval"] = float(eval_seconds)
    nonzero = sum(1 for tt in token_trees for n in tt.nodes if any(a != 0.0 for _, a in n.terms))
    record: dict[str, Any] = {
        "step": step,
        "reward": float(np.mean([leaf.reward for leaf in leaves])) if leaves else math.nan,
        "accuracy": float(np.mean([leaf.success for leaf in leaves])) if leaves else math.nan,
        "effective_ratio": report.effective_ratio(trees),
        "contrast_pairs_by_depth": {str(d): c for d, c in report.contrast_pairs_by_depth(trees).items()},
        "prompts": len(trees),
        "rollouts": led.rollouts,
        "continuations": led.continuations,
        "nominal_budget": led.nominal,
        "generated_tokens": led.generated_tokens,
        "prefill_tokens_uncached": led.prefill_tokens,
        "prefill_tokens_cached": cached,
        "env_steps": led.env_steps,
        "episode_errors": led.errors,
        "unspent_continuations": led.unspent_continuations,
        "fallback_first": bool(getattr(batch, "fallback_first", False)),
        "prefixes_seen": int(getattr(batch, "prefixes_seen", 0)),
        "truncations": dict(getattr(batch, "truncations", {}) or {}),
        "predictor_spearman_prompt": prompt_rho,
        "predictor_spearman_prefix": report.spearman(pred, emp) if len(pred) > 2 else math.nan,
        "predictor_loss": float(predictor_stats.get("loss", math.nan)) if predictor_stats else math.nan,
        "nodes_with_advantage": nonzero,
        "seconds": phases,
        "step_seconds": seconds,
    }
    record.update({f"policy/{k}": v for k, v in update.items() if k != "seconds"})
    if evaluation is not None:
        record["eval"] = {k: v for k, v in evaluation.items() if isinstance(v, (int, float, str))}
    return _finite(record)


def _scalars(record: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in record.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
            out[k] = float(v)
        elif isinstance(v, dict):
            out.update({f"{k}/{kk}": float(vv) for kk, vv in v.items() if isinstance(vv, (int, float))})
    return out


def summary_line(record: Mapping[str, Any], steps: int) -> str:
    """The one-line per-step summary printed under the progress bar."""
    s = record["seconds"]
    predictor = s.get("predictor_scoring", 0.0) + s.get("predictor_update", 0.0)
    num = lambda key: math.nan if record.get(key) is None else record[key]  # noqa: E731
    line = (f"step {record['step']}/{steps} | reward {num('reward'):.3f} | effective {num('effective_ratio'):.2f} "
            f"| {record['rollouts']}+{record['continuations']}/2 = {record['nominal_budget']:g} nominal, "
            f"{record['generated_tokens']} gen tok | gen {s.get('generation', 0):.0f}s env {s.get('environment', 0):.0f}s "
            f"pred {predictor:.1f}s update {s['policy_update']:.0f}s sync {s['weight_sync']:.1f}s")
    if "eval" in record:
        line += f" | eval acc {record['eval'].get('accuracy') or math.nan:.3f}"
    return line
