"""Where a training run's scalars go besides ``metrics.jsonl`` (which is always written):
``report_to: tensorboard | wandb | mlflow`` (a list allowed; none required).

Each backend is imported only when chosen, when the run starts (and by ``--dry-run``,
which checks that it imports), and each writes offline, inside the run dir:

- ``tensorboard``: event files in ``RUN/tb`` (``torch.utils.tensorboard``; needs the
  ``tensorboard`` package);
- ``wandb``: ``mode="offline"`` under ``RUN/wandb`` (``wandb sync`` uploads it later);
  ``WANDB_MODE`` set in the environment wins (``online`` to log live);
- ``mlflow``: a local file store ``RUN/mlruns`` (``mlflow ui --backend-store-uri RUN/mlruns``).

A chosen backend that is not installed is one line naming the package to install (exit 2).
A :class:`Reporter` is any object with ``log(scalars, step)`` and ``close()``;
:func:`register_reporter` adds one under a name (a plugin's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence


class Reporter(Protocol):
    """A sink of per-step scalars."""

    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, run_dir: Path, config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tb"))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    def __init__(self, run_dir: Path, config: Mapping[str, Any]):
        import wandb

        (run_dir / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(project="trace-gym", name=run_dir.name, dir=str(run_dir), config=dict(config),
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit=True)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    def __init__(self, run_dir: Path, config: Mapping[str, Any]):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        mlflow.set_experiment("trace-gym")
        self.run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({k: str(v)[:250] for k, v in config.items()})

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


#: name -> (the module that must import, its pip package, the factory ``(run_dir, flat config) -> Reporter``).
REPORTERS: dict[str, tuple[str, str, Callable[[Path, Mapping[str, Any]], Reporter]]] = {
    "tensorboard": ("tensorboard", "tensorboard", _TensorBoard),
    "wandb": ("wandb", "wandb", _Wandb),
    "mlflow": ("mlflow", "mlflow", _MLflow),
}


def register_reporter(name: str, factory: Callable[[Path, Mapping[str, Any]], Reporter], module: str = "",
                      package: str = "") -> None:
    """Add a backend under ``name`` (``module``: what must import first, ``package``: what to
    install when it does not)."""
    REPORTERS[name] = (module, package or module, factory)


def check_reporter_names(names: Sequence[str]) -> None:
    """``ValueError`` for a name that is no backend, with the closest ones."""
    from trace_gym.utils.suggest import did_you_mean

    for name in names:
        if name not in REPORTERS:
            raise ValueError(f"report_to: unknown backend {name!r}{did_you_mean(name, REPORTERS)}; "
                             f"known: {', '.join(REPORTERS)}")


def require_installed(names: Sequence[str]) -> None:
    """``ValueError`` (one line, naming the package) for a chosen backend that does not import."""
    import importlib.util

    check_reporter_names(names)
    for name in names:
        module, package, _ = REPORTERS[name]
        if module and importlib.util.find_spec(module) is None:
            raise ValueError(f"report_to: {name} is not installed (pip install {package}); metrics.jsonl is always "
                             f"written, or drop {name} from report_to")


def make_reporters(names: Sequence[str], run_dir: str | Path, config: Mapping[str, Any]) -> list[Reporter]:
    """The chosen backends, started on ``run_dir`` (each imported only now)."""
    require_installed(names)
    return [REPORTERS[name][2](Path(run_dir), config) for name in dict.fromkeys(names)]


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one ``metrics.jsonl`` line, flattened one level (``seconds/generation``)."""
    out = {}
    for k, v in record.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
            out[k] = float(v)
        elif isinstance(v, dict):
            out.update({f"{k}/{kk}": float(vv) for kk, vv in v.items()
                        if isinstance(vv, (int, float)) and not isinstance(vv, bool)})
    return out
