"""The one table that names rollout-allocation strategies (part of the face).

A :class:`~trace_gym.allocation.strategy.Strategy` (a core type) is a root allocator + a prefix
allocator + a budget shape; see :mod:`trace_gym.allocation.strategy` for the budget arithmetic.
This module (with ``cli.py`` and ``registry.py``) is the face: it is the one place
that maps names to allocators and so imports ``baselines/``; the core receives a
``Strategy`` as an object and never imports this table.

Adding a strategy is one entry in :data:`STRATEGIES`::

    STRATEGIES["my_tree"] = Strategy(
        root_allocator=MyRootAllocator(),          # .allocate(values, budget, rng)
        prefix_allocator=TracePrefixAllocator(),   # .allocate(repeat_probabilities, budget, rng)
        continuations_per_root=2,
        description="my roots, TRACE prefixes",
    )

after which ``trace-gym bench --sim`` benchmarks it beside the others (see
``docs/strategies.md``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from baselines.ar3po import AR3PO
from baselines.cero import CERO
from baselines.dapo import DAPODynamicSampling
from baselines.greso import GRESO
from baselines.knapsack import KnapsackRL
from baselines.mopps import MoPPS
from baselines.pcl import PCLRootAllocator
from baselines.pilot_commit import PilotCommit
from baselines.predictors import BetaPosteriorPredictor, RunningRatePredictor
from baselines.random_tree import RandomPrefixAllocator
from baselines.uniform import UniformRootAllocator
from trace_gym.allocation.allocators import GroupSized, TracePrefixAllocator, TraceRootAllocator
from trace_gym.allocation.split import TraceSplitAllocator
from trace_gym.predictor.kinds import register_predictor
from trace_gym.allocation.strategy import Strategy
from trace_gym.utils.suggest import check_name
from trace_gym.allocation.waves import is_wave_strategy

__all__ = ["STRATEGIES", "Strategy", "register_strategy", "shaped_strategies", "DEFAULT_GROUP_SIZE",
           "DEFAULT_CONTINUATIONS_PER_ROOT"]

#: GRPO's group size in the paper's setups (and the baselines' default).
DEFAULT_GROUP_SIZE = 8
#: Continuations per root rollout for tree strategies: the paper's best shape (M, 2).
DEFAULT_CONTINUATIONS_PER_ROOT = 2


#: Every strategy by name. A user's new strategy is one entry (see the module doc).
STRATEGIES: dict[str, Strategy] = {
    "uniform": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        description="GRPO: fixed group size on the first prompts of the pool, no expansion",
    ),
    "pcl": Strategy(
        PCLRootAllocator(DEFAULT_GROUP_SIZE),
        description="PCL: prompts predicted closest to 0.5, fixed group size, no expansion",
    ),
    "random_tree": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        RandomPrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="TreePO-style: GRPO roots, continuations at uniformly random prefixes",
    ),
    "trace": Strategy(
        TraceRootAllocator(),
        TracePrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="TRACE: exact root allocation + exact prefix expansion",
    ),
    "trace_adaptive": Strategy(
        TraceRootAllocator(),
        TraceSplitAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="beyond the paper: TRACE roots; each prompt's local budget to fresh roots or prefixes by "
                    "marginal gain per unit cost",
    ),
    "trace_root_only": Strategy(
        TraceRootAllocator(),
        RandomPrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="ablation: TRACE roots, random prefixes",
    ),
    "trace_prefix_only": Strategy(
        UniformRootAllocator(DEFAULT_GROUP_SIZE),
        TracePrefixAllocator(),
        DEFAULT_CONTINUATIONS_PER_ROOT,
        description="ablation: GRPO roots, TRACE prefix expansion",
    ),
    # the zoo: published allocation methods as wave strategies (baselines/, docs/strategies.md)
    "dapo": DAPODynamicSampling(DEFAULT_GROUP_SIZE),
    "greso": GRESO(DEFAULT_GROUP_SIZE),
    "mopps": MoPPS(DEFAULT_GROUP_SIZE),
    "knapsack": KnapsackRL(DEFAULT_GROUP_SIZE),
    "pilot_commit": PilotCommit(DEFAULT_GROUP_SIZE),
    "ar3po": AR3PO(),
    "cero": CERO(DEFAULT_GROUP_SIZE),
}

# the zoo's own predictors (each arm names its kind in its ``predictor`` attribute)
register_predictor("beta_posterior", BetaPosteriorPredictor,
                   description="per-prompt Beta posterior of root outcomes, decayed (MoPPS; CERO's Beta state)")
register_predictor("running_rate", RunningRatePredictor,
                   description="per-prompt success rate over its latest visits holding L rollouts (Knapsack RL)")


def register_strategy(name: str, strategy: Any) -> None:
    """Add ``strategy`` to :data:`STRATEGIES` as ``name`` (plugins and user code): a one-shot
    :class:`Strategy` or a wave strategy (:class:`~trace_gym.allocation.waves.WaveStrategy`).

    Raises ``ValueError`` for a name that is not a plain identifier-like word
    (:func:`~trace_gym.utils.suggest.check_name`), a name already taken by another strategy, or an
    object that is neither; registering the same object twice is a no-op.
    """
    check_name("strategy", name)
    if not isinstance(strategy, Strategy) and not is_wave_strategy(strategy):
        raise ValueError(f"strategy {name!r} must be a trace_gym.allocation.strategy.Strategy or have a plan(view, rng) "
                         f"method (a wave strategy), got {type(strategy).__name__}")
    if STRATEGIES.get(name, strategy) is not strategy:
        raise ValueError(f"strategy name {name!r} is taken; known: {sorted(STRATEGIES)}")
    STRATEGIES[name] = strategy


def shaped_strategies(names: Sequence[str], *, group_size: int, continuations_per_root: float,
                      extra: Mapping[str, Strategy] | None = None) -> dict[str, Strategy]:
    """The named strategies reshaped for one benchmark: the fixed group size G of the
    flat baselines' root allocators and the tree shape N of expanding strategies.

    Args:
        names: strategy names (``STRATEGIES`` keys or ``extra`` keys); empty means all.
        group_size: G for every root allocator that declares a group size
            (:class:`~trace_gym.allocation.allocators.GroupSized`: the built-in uniform and PCL ones,
            and any user allocator with ``group_size`` and ``with_group_size``).
        continuations_per_root: N for strategies that expand.
        extra: additional named strategies (e.g. a variant with another predictor).
    """
    table = {**STRATEGIES, **(extra or {})}
    names = list(names) or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        from trace_gym.utils.suggest import did_you_mean

        hints = "".join(did_you_mean(n, table) for n in unknown)
        raise ValueError(f"unknown strategies {unknown}{hints}; known: {sorted(table)}")
    out = {}
    for name in names:
        s = table[name]
        if is_wave_strategy(s):  # brings its own shape; only a declared group size is reshaped
            out[name] = s.with_group_size(group_size) if isinstance(s, GroupSized) else s
            continue
        s = s.with_continuations(continuations_per_root)
        if isinstance(s.root_allocator, GroupSized):
            s = dataclasses.replace(s, root_allocator=s.root_allocator.with_group_size(group_size))
        out[name] = s
    return out
