"""The module paths that stood in ``trace_gym/`` before the wings (issue 42), and what asking
for one does: importing an old path raises a ``ModuleNotFoundError`` naming its new home, and
so does asking a wing that used to be a module for one of that module's names (``from
trace_gym.env import AgentEnv``); no old path re-exports anything. ``import trace_gym``
installs the finder (:func:`install_finder`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: Each module that stood in ``trace_gym/`` before the wings -> its home since (issue 42).
MOVED: dict[str, str] = {
    "trace_gym.advantages": "trace_gym.train.advantages",
    "trace_gym.agent": "trace_gym.agent.loop",
    "trace_gym.allocation": "trace_gym.allocation.allocators",
    "trace_gym.allocation_dp": "trace_gym.allocation.dp",
    "trace_gym.allocation_solvers": "trace_gym.allocation.solvers",
    "trace_gym.allocation_split": "trace_gym.allocation.split",
    "trace_gym.backend": "trace_gym.train.backend",
    "trace_gym.batches": "trace_gym.train.batches",
    "trace_gym.bench": "trace_gym.bench.loop",
    "trace_gym.bench_bank": "trace_gym.bench.bank",
    "trace_gym.bench_pair": "trace_gym.bench.pair",
    "trace_gym.bench_rank": "trace_gym.bench.rank",
    "trace_gym.bench_checks": "trace_gym.bench.checks",
    "trace_gym.bench_env": "trace_gym.bench.env",
    "trace_gym.bench_modes": "trace_gym.bench.modes",
    "trace_gym.bench_report": "trace_gym.bench.report",
    "trace_gym.bench_sim": "trace_gym.bench.sim",
    "trace_gym.bench_sweep": "trace_gym.bench.sweep",
    "trace_gym.calibrate": "trace_gym.sim.calibrate",
    "trace_gym.chat": "trace_gym.agent.chat",
    "trace_gym.checkpoint": "trace_gym.runs.run_dir",
    "trace_gym.compare": "trace_gym.runs.compare",
    "trace_gym.compare_arms": "trace_gym.runs.compare_arms",
    "trace_gym.critic": "trace_gym.predictor.critic",
    "trace_gym.datafiles": "trace_gym.env.datafiles",
    "trace_gym.determinism": "trace_gym.utils.determinism",
    "trace_gym.driver": "trace_gym.step.driver",
    "trace_gym.embeddings": "trace_gym.predictor.embeddings",
    "trace_gym.entry_configs": ("trace_gym.bench.config (SimBenchConfig, EnvBenchConfig, BankBenchConfig), "
                                "trace_gym.train.config (TrainConfig, RESUMABLE_KEYS), "
                                "trace_gym.banks.config (BankRecordConfig), trace_gym.commands (ENTRY_CONFIGS)"),
    "trace_gym.env": "trace_gym.env.contract",
    "trace_gym.env_adapter": "trace_gym.env.adapter",
    "trace_gym.env_boundary": "trace_gym.env.boundary",
    "trace_gym.env_checks": "trace_gym.env.checks",
    "trace_gym.env_play": "trace_gym.env.play",
    "trace_gym.episode": "trace_gym.agent.episode",
    "trace_gym.learning": "trace_gym.step.learning",
    "trace_gym.planning": "trace_gym.allocation.planning",
    "trace_gym.policies": "trace_gym.runs.policies",
    "trace_gym.predictor": "trace_gym.predictor.kinds",
    "trace_gym.predictor_memory": "trace_gym.predictor.memory",
    "trace_gym.predictor_quality": "trace_gym.predictor.quality",
    "trace_gym.process_state": "trace_gym.env.process_state",
    "trace_gym.reporters": "trace_gym.runs.reporters",
    "trace_gym.rollout": "trace_gym.agent.rollout",
    "trace_gym.run_files": "trace_gym.runs.files (a run's files), trace_gym.runs.checkpoint (the checkpoint rules)",
    "trace_gym.sim": "trace_gym.sim.simulator",
    "trace_gym.sim_predictors": "trace_gym.sim.predictors",
    "trace_gym.spaces": "trace_gym.env.spaces",
    "trace_gym.strategy": "trace_gym.allocation.strategy",
    "trace_gym.strategy_boundary": "trace_gym.step.strategy_boundary",
    "trace_gym.strategy_replay": "trace_gym.step.strategy_replay",
    "trace_gym.suggest": "trace_gym.utils.suggest",
    "trace_gym.textsafe": "trace_gym.utils.textsafe",
    "trace_gym.threads": "trace_gym.utils.threads",
    "trace_gym.train": "trace_gym.train.loop",
    "trace_gym.train_dry_run": "trace_gym.train.dry_run",
    "trace_gym.train_metrics": "trace_gym.train.metrics",
    "trace_gym.trainer": "trace_gym.train.trainer",
    "trace_gym.transcripts": "trace_gym.agent.transcripts",
    "trace_gym.update_stats": "trace_gym.train.update_stats",
    "trace_gym.waves": "trace_gym.allocation.waves",
    "trace_gym.weights": "trace_gym.runs.weights",
}
#: Each package that moved whole: its modules keep their names under the new one.
MOVED_PACKAGES: dict[str, str] = {
    "trace_gym.distributed": "trace_gym.train.distributed",
}


def moved_to(module: str) -> str | None:
    """The home of ``module`` if it is an old dotted path (``trace_gym.bench_sim`` ->
    ``trace_gym.bench.sim``, ``trace_gym.distributed.cluster`` ->
    ``trace_gym.train.distributed.cluster``), else ``None``."""
    if module in MOVED:
        return MOVED[module]
    for old, new in MOVED_PACKAGES.items():
        if module == old or module.startswith(old + "."):
            return new + module[len(old):]
    return None


class _MovedPaths(importlib.abc.MetaPathFinder):
    """An old path fails with its new home; any other module is left to the finders after it."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        new = moved_to(fullname)
        if new is not None and not new.startswith(fullname + "."):  # a wing that was a module is a package now
            raise ModuleNotFoundError(f"{fullname} moved to {new} (trace_gym's wings)", name=fullname)
        return None


def moved_name(wing: str, name: str) -> Exception:
    """What asking ``wing`` (a package that was a module before the wings) for ``name``
    raises: an ``ImportError`` naming the module that holds ``name`` now where the old
    module's home has it, else the plain ``AttributeError`` (so ``hasattr`` and submodule
    imports work as usual). Each such wing's ``__getattr__`` raises what this returns."""
    home = MOVED.get(wing)
    if (home is not None and not name.startswith("__") and importlib.util.find_spec(f"{wing}.{name}") is None
            and hasattr(importlib.import_module(home), name)):
        return ImportError(f"{wing}.{name} moved: from {home} import {name} (trace_gym's wings)",
                           name=wing)
    return AttributeError(f"module {wing!r} has no attribute {name!r}")


def install_finder() -> None:
    """Put :class:`_MovedPaths` first on ``sys.meta_path`` (once): before an editable install's
    finder, which maps any ``trace_gym.X``."""
    if not any(isinstance(f, _MovedPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedPaths())
