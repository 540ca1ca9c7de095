"""``trace-gym train``: one training run from a :class:`~trace_gym.train.config.TrainConfig`.

The face's half of training: it looks the config's names up (env family, strategy,
training data, eval suite) into a :class:`~trace_gym.train.loop.TrainSetup`, picks the
backend (in process, or Ray with ``--ray``) and calls :func:`trace_gym.train.loop.train`.
Unknown keys and bad values fail with one line before any model loads.
"""

from __future__ import annotations

import argparse
from typing import Any

from trace_gym.commands import add_config_parser, command_config, summary
from trace_gym.utils.suggest import did_you_mean


def resolve_train_setup(cfg: Any) -> Any:
    """A :class:`trace_gym.train.loop.TrainSetup` from the config's names (env family, strategy,
    data, eval suite); raises ``ValueError`` naming an unknown one. Loads no model."""
    from environments.train_data import train_tasks
    from evaluators.run import TrainingEvaluator, training_eval_config
    from trace_gym.registry import resolve_env
    from trace_gym.strategies import STRATEGIES, shaped_strategies
    from trace_gym.train.loop import TrainSetup

    family = resolve_env(cfg.env, cfg.env_kwargs)  # a family short name or any registered env id
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}{did_you_mean(cfg.strategy, list(STRATEGIES))}; "
                         f"known: {sorted(STRATEGIES)}")
    tasks = train_tasks(cfg.data, family, pool=cfg.train_pool, seed=cfg.seed, heldout_fraction=cfg.heldout_fraction,
                        path=cfg.data_path)
    strategy = shaped_strategies([cfg.strategy], group_size=cfg.group_size,
                                 continuations_per_root=cfg.continuations_per_root)[cfg.strategy]
    evaluator = TrainingEvaluator(training_eval_config(cfg))  # checks eval_suite, whether or not it runs
    return TrainSetup(strategy=strategy, make_env=family.make_env, load_train_tasks=tasks.load,
                      evaluate=evaluator if cfg.eval_every else None, data_offline=tasks.offline,
                      describe={"env": f"{cfg.env}: {family.env_id} {dict(family.env_kwargs)}",
                                "data": tasks.description,
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

    from trace_gym.runs.policies import with_policy
    from trace_gym.registry import load_plugins
    from trace_gym.train.config import TrainConfig
    from trace_gym.train.loop import train
    from trace_gym.train.dry_run import dry_run

    from trace_gym.runs.output_paths import check_config_outputs

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
    from trace_gym.train.advantages import ESTIMATORS
    from trace_gym.train.config import TrainConfig

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
