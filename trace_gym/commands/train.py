"""``trace-gym train``: one training run from a :class:`~trace_gym.entry_configs.TrainConfig`.

The face's half of training: it looks the config's names up (env family, strategy,
training data, eval suite) into a :class:`~trace_gym.train.TrainSetup`, picks the
backend (in process, or Ray with ``--ray``) and calls :func:`trace_gym.train.train`.
Unknown keys and bad values fail with one line before any model loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trace_gym.commands import add_config_parser, command_config, summary
from trace_gym.suggest import did_you_mean


def resolve_train_setup(cfg: Any) -> Any:
    """A :class:`trace_gym.train.TrainSetup` from the config's names (env family, strategy,
    data, eval suite); raises ``ValueError`` naming an unknown one. Loads no model."""
    from evaluators import suites
    from evaluators.run import EvalConfig, evaluate_cached
    from trace_gym.datafiles import split_tasks
    from trace_gym.registry import resolve_env
    from trace_gym.strategies import STRATEGIES, shaped_strategies
    from trace_gym.train import TrainSetup

    family = resolve_env(cfg.env, cfg.env_kwargs)  # a family short name or any registered env id
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}{did_you_mean(cfg.strategy, list(STRATEGIES))}; "
                         f"known: {sorted(STRATEGIES)}")
    source = suites.get_train_data(cfg.data) if cfg.data else None
    if cfg.eval_every:
        suites.get_suite(cfg.eval_suite)
    strategy = shaped_strategies([cfg.strategy], group_size=cfg.group_size,
                                 continuations_per_root=cfg.continuations_per_root)[cfg.strategy]
    if source is not None:
        def load():
            return suites.load_train_data(cfg.data, cfg.train_pool, cfg.seed, cfg.data_path)
        offline = source.offline or bool(cfg.data_path)
        data_line = f"{cfg.data} ({cfg.data_path or source.description})"
    else:
        def load():
            size = int(cfg.train_pool / max(1e-9, 1 - cfg.heldout_fraction)) + 16
            while True:
                kept = split_tasks(family.load_tasks(size, seed=cfg.seed), "train", cfg.heldout_fraction)
                if len(kept) >= cfg.train_pool or size > 64 * cfg.train_pool:
                    return kept[: cfg.train_pool]
                size *= 2

        offline = True
        data_line = f"{family.task_loader} minus the held-out {cfg.heldout_fraction:.0%}"

    eval_cfg = EvalConfig(policy=(cfg.policy,), suites=(cfg.eval_suite,), limit=cfg.eval_tasks,
                          samples=cfg.eval_samples, temperature=0.0 if cfg.eval_samples == 1 else cfg.temperature,
                          seed=cfg.seed, engine=cfg.engine, heldout_fraction=cfg.heldout_fraction,
                          max_turns=cfg.max_turns, max_turn_tokens=cfg.max_turn_tokens,
                          max_episode_tokens=cfg.max_episode_tokens, env_kwargs=cfg.env_kwargs,
                          progress=cfg.progress)

    def evaluate(engine: Any, step: int) -> dict[str, Any]:
        if step == 0:  # the initial policy: the same cache as `trace-gym eval` with these settings
            from trace_gym.models import resolve_model

            return evaluate_cached(eval_cfg, Path(resolve_model(cfg.policy)), cfg.eval_suite, engine)[0]
        limits = {"max_turns": cfg.max_turns, "max_turn_tokens": cfg.max_turn_tokens,
                  "max_episode_tokens": cfg.max_episode_tokens}
        return suites.evaluate(engine, cfg.eval_suite, limit=cfg.eval_tasks, samples=cfg.eval_samples,
                               temperature=eval_cfg.temperature, seed=cfg.seed, heldout_fraction=cfg.heldout_fraction,
                               progress=cfg.progress, agent_limits=limits, env_kwargs=cfg.env_kwargs)

    return TrainSetup(strategy=strategy, make_env=family.make_env, load_train_tasks=load,
                      evaluate=evaluate if cfg.eval_every else None, data_offline=offline,
                      describe={"env": f"{cfg.env}: {family.env_id} {dict(family.env_kwargs)}", "data": data_line,
                                "eval": f"{cfg.eval_suite} every {cfg.eval_every} steps" if cfg.eval_every else "-"})


def eval_env_warning(cfg: Any) -> str | None:
    """One line when the run evaluates a suite that runs in another env than its training
    env (its accuracy would be printed as held-out accuracy), else ``None``.

    Conservative: only the registered env ids are compared, so a suite of the same env
    with other tasks (``generated`` for ``math_python_hard``) is not flagged.
    """
    from evaluators import suites
    from trace_gym.registry import resolve_env

    if not cfg.eval_every:
        return None
    train_env, eval_env = resolve_env(cfg.env).env_id, suites.get_suite(cfg.eval_suite).env_id
    if eval_env == train_env:
        return None
    try:  # a suite named by the env id itself, where the suite table has one
        fix = f"eval_suite={suites.get_suite(train_env).name}"
    except ValueError:
        fix = f"eval_suite set to a suite of {train_env}"
    return (f"WARNING: eval_suite {cfg.eval_suite!r} runs in {eval_env}, but training runs in {train_env} "
            f"(env={cfg.env}): its accuracy is not held-out accuracy on the training env; train with {fix}, "
            "or eval_every=0")


def cmd_train(args: argparse.Namespace) -> int:
    import sys

    from trace_gym.policies import with_policy
    from trace_gym.registry import load_plugins
    from trace_gym.entry_configs import TrainConfig
    from trace_gym.train import train
    from trace_gym.train_dry_run import dry_run

    from trace_gym.output_paths import check_config_outputs

    load_plugins()  # installed plugins: envs, strategies and estimators named by the config
    cfg = command_config(TrainConfig, args, {"ray": args.ray})
    check_config_outputs(cfg)  # run_dir: a folder that can be written, before anything loads
    cfg = with_policy(cfg)  # before the run dir exists
    if cfg.critic_model and cfg.predictor == "lm_critic":
        cfg = with_policy(cfg, key="critic_model")
    setup = resolve_train_setup(cfg)
    warning = eval_env_warning(cfg)
    if warning:  # before anything loads: a long run would report the wrong env's accuracy
        print(warning, file=sys.stderr)
    if args.dry_run:
        print(dry_run(cfg, setup))
        return 0
    result = train(cfg, setup)  # the backend (in process, or Ray with --ray) is built and closed inside
    print(f"wrote {result['run_dir']}/metrics.jsonl ({len(result['metrics'])} steps)")
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    from trace_gym.advantages import ESTIMATORS
    from trace_gym.entry_configs import TrainConfig

    estimators = "advantage estimators (advantage=NAME; plugins add more with register_estimator):\n" + "\n".join(
        f"  {name}: {summary(fn)}"
        for name, fn in ESTIMATORS.items()) + "\n\n"
    p = add_config_parser(subparsers, "train", "train a policy with a rollout strategy (run dir, resume, eval)",
                          TrainConfig, epilog_prefix="Every key is also a --flag (--steps 2 = steps=2, --trainer.lr 1e-5 "
                          "= trainer.lr=1e-5).\n\n" + estimators, flags=True, skip=("ray",))
    p.add_argument("--dry-run", action="store_true", help="resolve config, data, env and strategy; load no model")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on Ray: start a local cluster, or join ADDRESS (auto, host:6379); docs/distributed.md")
    p.set_defaults(func=cmd_train)
