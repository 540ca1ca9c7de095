"""trace_gym's public API: everything a user's own package needs, in one module.

The docs import only from here; names in :data:`__all__` are stable (a change is a
breaking change and is announced). It is part of the face (with ``cli.py``,
``registry.py`` and ``strategies.py``): it may name the built-in allocators.

Contracts:
    ``AgentEnv``, ``Snapshot``, ``freeze``/``thaw``, ``rng_state``/``rng_from_state``,
    ``task_from_options``, ``check_env``, ``EnvCheckError``; ``Task``, ``Message``;
    ``TextAction``, ``ChatObservation`` (spaces); the optional env Protocols
    ``ReferenceActions``, ``ReplayCost``, ``StopStrings``; another framework's env under
    the contract: ``ForeignEnv`` around a ``ForeignEpisode`` driver (``CopyState`` /
    ``NativeState`` for the copy and native snapshot strategies).
Strategies:
    ``Strategy``; the allocator Protocols ``RootAllocator``, ``PrefixAllocator``,
    ``GroupSized``; ``fixed_groups(order, budget, group_size, n)`` (groups of G in a
    priority order, the building block of GRPO/PCL); the built-in allocators
    ``UniformRootAllocator``,
    ``PCLRootAllocator``, ``RandomPrefixAllocator``, ``TraceRootAllocator``,
    ``TracePrefixAllocator``; the exact solvers ``solve_root``, ``solve_prefix``;
    ``STRATEGIES``, ``register_strategy`` and ``shaped_strategies`` (a table reshaped for a
    bench: group size and tree shape). Strategies that act in waves: ``WaveStrategy`` (the
    Protocol), what it reads (``StepView``, ``PrefixView``, ``PromptHistory``) and returns
    (``Wave``), ``ROOT_UNITS``; ``OneShot`` (a one-shot ``Strategy`` as a wave strategy).
Environments:
    ``register_env`` (a Gymnasium id + its task loader), ``resolve_env``, ``EnvFamily``.
Evaluation:
    ``register_suite`` (a named suite for ``trace-gym eval --suite`` and ``eval_suite``; an env
    id with a task loader is a suite without it).
Trees and benches:
    ``RolloutTree``, ``BudgetLedger``; ``run_sim_bench``, ``run_env_bench``,
    ``format_bench``, ``SimBenchConfig``, ``EnvBenchConfig``.
Training:
    ``TrainConfig``, ``TrainSetup``, ``train``; the advantage estimators:
    ``AdvantageEstimator`` (the Protocol; it returns ``PathAdvantages`` per leaf or a
    ``{node: A}`` mapping), ``ESTIMATORS`` and ``register_estimator``
    (or the ``trace_gym.train.advantages`` entry-point group); the success predictors:
    ``SuccessPredictor``, ``PREDICTORS``, ``make_predictor``, ``register_predictor``.
"""

from __future__ import annotations

from typing import Any, Callable

from baselines.pcl import PCLRootAllocator
from baselines.random_tree import RandomPrefixAllocator
from baselines.uniform import UniformRootAllocator, fixed_groups
from evaluators.suites import register_suite
from trace_gym.allocation.allocators import (
    GroupSized,
    PrefixAllocator,
    RootAllocator,
    TracePrefixAllocator,
    TraceRootAllocator,
    solve_prefix,
    solve_root,
)
from trace_gym.train.advantages import ESTIMATORS, AdvantageEstimator, PathAdvantages, register_estimator
from trace_gym.bench.report import format_bench
from trace_gym.bench.env import run_env_bench
from trace_gym.bench.sim import run_sim_bench
from trace_gym.budget import ROOT_UNITS, BudgetLedger
from trace_gym.bench.config import EnvBenchConfig, SimBenchConfig
from trace_gym.env.adapter import CopyState, ForeignEnv, ForeignEpisode, NativeState
from trace_gym.env.checks import check_env
from trace_gym.env.contract import (
    AgentEnv,
    EnvCheckError,
    ReferenceActions,
    ReplayCost,
    Snapshot,
    StopStrings,
    freeze,
    rng_from_state,
    rng_state,
    task_from_options,
    thaw,
)
from trace_gym.predictor.kinds import PREDICTORS, SuccessPredictor, make_predictor, register_predictor
from trace_gym.env.family import EnvFamily
from trace_gym.registry import resolve_env
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.strategies import STRATEGIES, register_strategy, shaped_strategies
from trace_gym.allocation.strategy import Strategy
from trace_gym.train.config import TrainConfig
from trace_gym.train.loop import TrainSetup, train
from trace_gym.tree import RolloutTree
from trace_gym.types import Message, Task
from trace_gym.allocation.waves import OneShot, PrefixView, PromptHistory, StepView, Wave, WaveStrategy


def register_env(env_id: str, entry_point: str | Callable[..., Any],
                 task_loader: str | Callable[..., list] | None = None, **kwargs: Any) -> str:
    """Register an env with Gymnasium (under ``trace_gym/`` when ``env_id`` has no namespace)
    and, optionally, its task loader ``loader(n, seed=0, **kw) -> list[Task]`` (else the env
    class's ``load_tasks`` classmethod is used). Returns the full id.

    After this, every command takes the env by id: ``trace-gym bench --env ID``.
    """
    import gymnasium
    from gymnasium.envs.registration import registry

    from trace_gym import registry as face

    full = env_id if "/" in env_id else f"{face.NAMESPACE}/{env_id}"
    if full not in registry:
        gymnasium.register(id=full, entry_point=entry_point, **kwargs)
    if task_loader is not None:
        face.TASK_LOADERS[full] = task_loader
    return full


__all__ = [
    "AdvantageEstimator", "ESTIMATORS", "PathAdvantages", "PREDICTORS", "SuccessPredictor", "TrainConfig", "TrainSetup",
    "make_predictor", "register_estimator", "register_predictor", "train",
    "ROOT_UNITS", "OneShot", "PrefixView", "PromptHistory", "StepView", "Wave", "WaveStrategy",
    "AgentEnv", "BudgetLedger", "GroupSized", "ChatObservation", "EnvBenchConfig", "EnvCheckError", "EnvFamily", "Message",
    "PCLRootAllocator", "PrefixAllocator", "RandomPrefixAllocator", "ReferenceActions", "ReplayCost", "RolloutTree",
    "RootAllocator", "STRATEGIES", "SimBenchConfig", "Snapshot", "StopStrings", "Strategy", "Task", "TextAction", "TracePrefixAllocator", "TraceRootAllocator",
    "UniformRootAllocator", "check_env", "fixed_groups", "format_bench", "freeze", "register_env",
    "register_strategy", "register_suite", "resolve_env", "rng_from_state", "rng_state", "run_env_bench", "run_sim_bench",
    "shaped_strategies", "CopyState", "ForeignEnv", "ForeignEpisode", "NativeState",
    "solve_prefix", "solve_root", "task_from_options", "thaw",
]
