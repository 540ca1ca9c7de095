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
The backends start before training does (before any model loads), and one that cannot start
(a ``tb`` that is a file) is one line too (exit 2). After that a backend that fails (a metric
name with a lone surrogate, an events folder deleted under it) warns once and is switched
off for the rest of the run: ``metrics.jsonl`` is the record, and training goes on.
A :class:`Reporter` is any object with ``log(scalars, step)`` and ``close()``;
:func:`register_reporter` adds one under a name (a plugin's).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from trace_gym.utils.textsafe import clean_text

_log = logging.getLogger(__name__)


class Reporter(Protocol):
    """A sink of per-step scalars."""

    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class _TensorBoard:
    def __init__(self, run_dir: Path, config: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_dir / "tb"
        self.writer = SummaryWriter(str(self.folder))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        # a folder deleted under the writer fails here, in this call, not later in the writer's
        # own thread (which dies with a traceback); each step is flushed, so it finds none pending
        if not self.folder.is_dir():
            raise FileNotFoundError(f"the events folder {self.folder} is gone")
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

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


def _said(exc: BaseException) -> str:
    return clean_text(f"{type(exc).__name__}: {exc}")[:300]


class Guarded:
    """A started backend whose failures never reach training: the first one (in ``log`` or
    ``close``) warns once, naming the backend, and switches it off (``close`` is still
    tried, quietly, to release what it holds)."""

    def __init__(self, name: str, reporter: Reporter):
        self.name, self.reporter, self.off = name, reporter, False

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        if self.off:
            return
        try:
            self.reporter.log(scalars, step)
        except Exception as exc:  # noqa: BLE001  (a third-party writer: whatever it raises)
            self._fail(f"at step {step}", exc)

    def close(self) -> None:
        try:
            self.reporter.close()
        except Exception as exc:  # noqa: BLE001
            if not self.off:
                self._fail("closing", exc)

    def _fail(self, when: str, exc: Exception) -> None:
        self.off = True
        _log.warning("report_to: %s failed %s (%s); switched off for the rest of the run (metrics.jsonl has every "
                     "step)", self.name, when, _said(exc))


def make_reporters(names: Sequence[str], run_dir: str | Path, config: Mapping[str, Any]) -> list[Reporter]:
    """The chosen backends, started on ``run_dir`` (each imported only now), each
    :class:`Guarded`.

    Raises:
        ValueError: a backend not installed, or one that cannot start (one line naming it and
            why; the ones started before it are closed).
    """
    require_installed(names)
    started: list[Reporter] = []
    for name in dict.fromkeys(names):
        try:
            started.append(Guarded(name, REPORTERS[name][2](Path(run_dir), config)))
        except Exception as exc:  # noqa: BLE001  (a third-party writer: whatever it raises)
            for reporter in started:
                reporter.close()
            raise ValueError(f"report_to: {name} could not start in {str(run_dir)!r} ({_said(exc)}); fix that, or "
                             f"drop {name} from report_to (metrics.jsonl is always written)") from exc
    return started


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
