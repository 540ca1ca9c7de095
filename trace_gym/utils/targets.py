"""``"module:attr"`` strings: the one reader of every table that names code by string.

A table of strings costs nothing to import; what an entry names is imported when it is
used. The tables: the commands of the parser (:data:`trace_gym.cli.COMMANDS`), the engines
(:data:`trace_gym.engines.ENGINES`), the predictor kinds
(:data:`trace_gym.predictor.kinds.PREDICTORS`), the bench modes
(:data:`trace_gym.bench.modes.BENCH_SOURCES`), the entry points' configs
(:data:`trace_gym.commands.ENTRY_CONFIGS`), and the env entry points and task loaders of the
registry (:mod:`trace_gym.registry`, :class:`trace_gym.env.family.EnvFamily`).
"""

from __future__ import annotations

import importlib
from typing import Any


def load_target(target: str) -> Any:
    """The object ``"package.module:attr"`` names (``attr`` may be dotted,
    ``"module:Class.method"``; without ``":attr"``, the module itself), its module imported.

    Raises:
        ImportError: the module cannot be imported.
        AttributeError: the module has no such attribute.
    """
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj
