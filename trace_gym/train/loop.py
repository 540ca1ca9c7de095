"""The training loop, top to bottom (trace-method.md, "One training step"), and its config.

:func:`train` reads like CleanRL's ``ppo.py``: per step it samples candidate prompts,
runs the one step driver on them (``rollout.collect``: rollout trees with the strategy,
then the success predictor's update on the trees), computes advantages with the chosen
estimator, updates the policy (:class:`~trace_gym.train.trainer.PolicyTrainer`), pushes
the weights to the rollout engine, logs one metrics line, checkpoints, and evaluates
every ``eval_every`` steps. Strategies, environments and estimators arrive as objects
(:class:`TrainSetup`) or through the estimator table, and the trainer, engine and agent
runners come from one backend object (:class:`~trace_gym.train.backend.TrainBackend`: in
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

from trace_gym.train.advantages import get_estimator
from trace_gym.runs.checkpoint import load_predictor_state, predictor_state, require_predictor_state
from trace_gym.runs.files import load_state_file
from trace_gym.runs.run_dir import RunDir
from trace_gym.config import flatten, load_yaml, to_yaml
from trace_gym.step.driver import forecast_fallback_first
from trace_gym.step.learning import brief_repeats
from trace_gym.train.config import RESUMABLE_KEYS, TrainConfig
from trace_gym.runs.reporters import make_reporters, require_installed, scalars
from trace_gym.train.metrics import step_record, summary_line
from trace_gym.types import Task

#: What only a resume reads: dropped from a checkpoint once a newer one is written (and from
#: the last one with ``keep_final_state: false``); the weights stay.
RESUME_FILES = ("trainer*.pt", "predictor.pt", "rng.pt")


def config_differences(stored_yaml: str, new_yaml: str) -> list[str]:
    """Keys whose values differ between two resolved configs, ignoring :data:`RESUMABLE_KEYS`.

    A key one side lacks (a run written before the key existed) counts as its default, so
    a run resumes under a newer version as long as it leaves the new keys at their defaults.
    """

    def flat(text: str) -> dict:
        return flatten(TrainConfig, load_yaml(text) or {})

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


def report_backends(cfg: TrainConfig) -> list[str]:
    """The chosen ``report_to`` backends (``tensorboard: true`` included), each once."""
    return list(dict.fromkeys([*cfg.report_to, *(["tensorboard"] if cfg.tensorboard else [])]))


# ---------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, setup: TrainSetup, *, out: Any = None, backend: Any = None) -> dict[str, Any]:
    """Run (or resume) training; returns ``{"run_dir", "steps", "metrics": [...]}``.

    ``backend`` (a :class:`~trace_gym.train.backend.TrainBackend`) builds the trainer, the engine
    and each step's agent runner; default: :func:`~trace_gym.train.backend.backend_for` ``cfg``
    (in process, or on Ray when ``cfg.ray`` is set), built only once there is a step to
    run. The engine, the backend (a given one too) and the ``report_to`` backends are closed
    on every way out: a finished run, one with nothing left to do, a refused resume, an
    exception mid-step; one of them failing to close does not keep the others open.
    """
    import contextlib
    import dataclasses

    from tqdm.auto import tqdm

    from trace_gym.runs import checkpoint
    from trace_gym.utils import determinism
    from trace_gym.train.backend import backend_for
    from trace_gym.models import quiet_third_party, resolve_model

    quiet_third_party()
    out = out or sys.stdout
    say = lambda msg: tqdm.write(msg, file=out) if cfg.progress else None  # noqa: E731
    with contextlib.ExitStack() as closing:
        # first in, last out: before the trainer, engine and predictor read the thread count
        if (mode := closing.enter_context(determinism.applied(cfg))) is not None:
            say(mode.describe())
        if backend is not None:
            closing.callback(backend.close)
        require_installed(report_backends(cfg))  # reporters, data and policy before the run dir exists
        tasks = list(setup.load_train_tasks())[: cfg.train_pool]
        base_policy = resolve_model(cfg.policy)
        run = RunDir(cfg.run_dir, step_files=checkpoint.TRAINING_STEP_FILES)
        closing.callback(run.close)
        resume = run.start(to_yaml(cfg), compare=config_differences)  # refuses a touched checkpoint, moves nothing
        start = resume.step if resume else 0
        if start >= cfg.steps:
            say(f"{cfg.run_dir}: all {cfg.steps} steps are done")
            return {"run_dir": cfg.run_dir, "steps": start, "metrics": run.read_metrics()}
        if resume and not resume.resumable:
            raise ValueError(f"run dir {cfg.run_dir!r}: its newest checkpoint (step {start}) keeps weights only "
                             "(keep_final_state: false), so it cannot continue exactly; use a new run_dir (policy="
                             f"{cfg.run_dir}@{start} is not a model folder: eval it, or start from its checkpoint's "
                             "policy/ folder)")
        # started before any model loads: one that cannot start (a tb that is a file) is one line
        reporters = make_reporters(report_backends(cfg), run.path, dataclasses.asdict(cfg))
        for reporter in reporters:
            closing.callback(reporter.close)
        weights = resume.policy_path if resume else base_policy
        if backend is None:
            backend = backend_for(cfg)
            closing.callback(backend.close)
        trainer = backend.make_trainer(weights, cfg.trainer, total_steps=cfg.steps, temperature=cfg.temperature,
                                       device=cfg.device, seed=cfg.seed)
        engine = backend.make_engine(cfg.engine, weights, **cfg.engine_kwargs)
        closing.callback(engine.close)
        if (note := determinism.engine_note(engine)) is not None:
            print(note, file=sys.stderr)
        _loop(cfg, setup, run, resume, tasks, str(base_policy), trainer, engine, backend, reporters, say, out)
    return {"run_dir": cfg.run_dir, "steps": cfg.steps, "metrics": run.read_metrics()}


def _loop(cfg: TrainConfig, setup: TrainSetup, run: RunDir, resume: Any, tasks: Sequence[Task], base_policy: str,
          trainer: Any, engine: Any, backend: Any, reporters: Sequence[Any], say: Callable, out: Any) -> None:
    """Steps ``start + 1 .. cfg.steps``, top to bottom."""
    from tqdm.auto import tqdm

    from trace_gym.models import resolve_model
    from trace_gym.predictor.kinds import make_predictor, reads_a_model

    start = resume.step if resume else 0
    critic = str(resolve_model(cfg.critic_model)) if cfg.critic_model and reads_a_model(cfg.predictor) else base_policy
    predictor = make_predictor(cfg.predictor, cfg.predictor_kwargs, model_path=critic, seed=cfg.seed)
    require_predictor_state(predictor)  # before step 1, not at the first checkpoint
    cursor = TaskCursor(len(tasks), cfg.seed)
    rng = np.random.default_rng([cfg.seed, 1])
    fallback_first = False  # the single-turn forecast (driver.forecast_fallback_first), kept in state.json
    if resume:
        trainer.load_state(resume.path)
        _load_predictor(predictor, resume.path / "predictor.pt")
        fallback_first = _load_rng(resume.path, cursor, rng)
        trainer.sync_weights(engine, version=start)  # the engine serves the checkpoint's weights
        say(f"resuming {cfg.run_dir} after step {start}")
    if setup.evaluate is not None and cfg.eval_at_start and not (run.path / "evals" / "step-0.json").exists():
        evaluation = setup.evaluate(engine, 0)  # before any update: the initial policy
        (run.path / "evals").mkdir(exist_ok=True)
        (run.path / "evals" / "step-0.json").write_text(json.dumps(evaluation, default=str))
        say(f"step 0 (initial policy): held-out accuracy {evaluation.get('accuracy', math.nan):.3f}")
    said: list[str] = []  # the no-contrast warnings so far: each one's advice once
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
            said.append(batch.learning.warning.at(f"step {step}"))
            tqdm.write(f"WARNING: {brief_repeats(said)[-1]}", file=sys.stderr)
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
                             time.perf_counter() - t_step, token_trees, eval_seconds, cpu_threads())
        checkpoint = step % cfg.checkpoint_every == 0 or step == cfg.steps
        bar.set_postfix_str("checkpoint" if checkpoint else "")
        run.commit(step, record, (lambda folder: _write_checkpoint(folder, step, trainer, predictor, cursor, rng,
                                                                   fallback_first))
                   if checkpoint else None, keep=cfg.keep_checkpoints, drop_superseded=RESUME_FILES)
        if step == cfg.steps and not cfg.keep_final_state:
            run.drop_files(step, RESUME_FILES)  # a finished run: the weights stay, the resume state goes
        for reporter in reporters:
            reporter.log(scalars(record), step)
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
    ``fallback_first`` as :func:`trace_gym.step.driver.run_step`.

    Returns ``(batch, token_trees, update metrics, weight-sync seconds)``.
    """
    from trace_gym.train.batches import token_tree
    from trace_gym.agent.rollout import collect
    from trace_gym.types import SamplingParams

    # 2-3. the one step: rollout trees (predictor scoring, root allocation, prefix
    #      expansion), then the predictor's update on their recursive-mean targets
    status("rollouts")
    sampling = SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature,
                              seed=cfg.seed * 1_000_003 + step)
    agent_cfg = cfg.agent_config()
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


def cpu_threads() -> int:
    """The process's CPU thread count now (torch's intra-op count, between components)."""
    import torch

    return torch.get_num_threads()


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

    from trace_gym.runs.checkpoint import read_state

    state = read_state(folder, int(folder.name.split("-")[1]))  # bounded and checked (verified at start too)
    cursor.load(state["cursor"])
    saved = load_state_file(folder / "rng.pt")
    try:
        rng.bit_generator.state = saved["generator"]
        random.setstate(saved["python"])
        np.random.set_state(saved["numpy"])
        torch.set_rng_state(saved["torch"])
    except Exception as exc:  # noqa: BLE001  (a file of the wrong shape: KeyError, TypeError, ValueError...)
        raise ValueError(f"{folder / 'rng.pt'} does not hold the RNG states a checkpoint saves "
                         f"({type(exc).__name__}: {str(exc)[:200]})") from None
    return bool(state.get("fallback_first", False))


def _load_predictor(predictor: Any, path: Path) -> None:
    """Restore ``predictor`` from a checkpoint's ``predictor.pt`` (read without running code)."""
    state = load_state_file(path)
    try:
        load_predictor_state(predictor, state)
    except Exception as exc:  # noqa: BLE001  (a file of the wrong shape)
        raise ValueError(f"{path} does not hold this predictor's state ({type(exc).__name__}: {str(exc)[:200]})") \
            from None
