"""Tests that register plugins (strategies, env ids, task loaders) put the registries back."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def registries_restored(drop_module: Callable[[str, object], bool]) -> Iterator[None]:
    """On exit: the strategy table, the task loaders and Gymnasium's env ids as on entry,
    and every module ``drop_module(name, module)`` selects removed from ``sys.modules``."""
    from gymnasium.envs.registration import registry as gym_registry

    from trace_gym import registry
    from trace_gym.strategies import STRATEGIES

    saved = (dict(STRATEGIES), dict(registry.TASK_LOADERS), set(gym_registry))
    try:
        yield
    finally:
        for name, module in list(sys.modules.items()):
            if drop_module(name, module):
                del sys.modules[name]
        STRATEGIES.clear()
        STRATEGIES.update(saved[0])
        registry.TASK_LOADERS.clear()
        registry.TASK_LOADERS.update(saved[1])
        for env_id in set(gym_registry) - saved[2]:
            gym_registry.pop(env_id)
