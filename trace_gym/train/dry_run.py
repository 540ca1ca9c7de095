"""``trace-gym train --dry-run``: resolve a training config without loading a model."""

from __future__ import annotations

from trace_gym.train.config import TrainConfig
from trace_gym.predictor.kinds import predictor_spec, reads_a_model
from trace_gym.runs.reporters import require_installed
from trace_gym.train.loop import TrainSetup, report_backends


def dry_run(cfg: TrainConfig, setup: TrainSetup) -> str:
    """Resolve everything but the model: budget split, data, one env reset, estimator, the
    critic's size."""
    from trace_gym.predictor.critic import critic_plan

    roots, continuations = setup.strategy.budget_split(cfg.nominal_budget)
    predictor_spec(cfg.predictor, cfg.predictor_kwargs, model_path=str(cfg.policy), seed=cfg.seed)
    lines = [f"trace-gym train --dry-run: {cfg.run_dir}",
             f"  policy: {cfg.policy} (engine {cfg.engine}, trainer device {cfg.device}; not loaded)",
             f"  strategy: {cfg.strategy}: {getattr(setup.strategy, 'description', '')}",
             f"  budget per step: {cfg.nominal_budget:g} nominal = {roots} root rollouts + {continuations} "
             f"continuations / 2, from {cfg.candidates} candidates",
             f"  predictor: {cfg.predictor} {cfg.predictor_kwargs or ''}".rstrip(),
             *([f"  critic: {critic_plan(cfg.critic_model or str(cfg.policy), cfg.predictor_kwargs).describe()}"]
               if reads_a_model(cfg.predictor) else []),
             f"  advantage: {cfg.advantage} (std normalise {cfg.advantage_std_normalize}); loss "
             f"{cfg.trainer.loss_aggregation}, clip [{1 - cfg.trainer.clip_low:g}, {1 + cfg.trainer.clip_high:g}], "
             f"lr {cfg.trainer.lr:g} ({cfg.trainer.lr_schedule}, warm-up {cfg.trainer.warmup_steps}); "
             f"{_plural(cfg.trainer.ppo_epochs, 'epoch')} x {_plural(cfg.trainer.mini_batches, 'mini-batch')} per batch "
             f"({'on-policy' if cfg.trainer.ppo_epochs * cfg.trainer.mini_batches == 1 else 'off-policy after the first optimizer step'})"]
    lines += [f"  {k}: {v}" for k, v in setup.describe.items()]
    if setup.data_offline:
        tasks = setup.load_train_tasks()
        lines.append(f"  training prompts: {len(tasks)} (first: {tasks[0].id if tasks else '-'})")
        if tasks:
            env = setup.make_env()
            try:
                obs, _ = env.reset(seed=cfg.seed, options={"task": tasks[0]})
                lines.append(f"  environment: reset OK ({len(obs)} messages in the first observation)")
            finally:
                env.close()
    else:
        lines.append("  training prompts: loaded at train time (remote data is not fetched by --dry-run)")
    require_installed(report_backends(cfg))
    lines.append(f"  steps: {cfg.steps}; checkpoint every {cfg.checkpoint_every}; eval every {cfg.eval_every or '-'}")
    return "\n".join(lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("h") else f"{n} {word}s"
