"""Run directories: the resolved config, one metrics line per step, atomic checkpoints, resume.

Layout of a run directory::

    config.yaml              the resolved config (written once; a rerun must match it)
    metrics.jsonl            one JSON object per finished step, in step order
    checkpoints/step-N/      policy/ (HF weights + tokenizer), trainer.pt (optimizer, schedule),
                             predictor.pt, state.json (step, RNG states, data cursor),
                             metrics.json (step N's metrics line)
    evals/step-N.json        evaluations run during training

Crash safety (SIGKILL at any instant):

- a checkpoint is written into ``checkpoints/.tmp-step-N-<pid>`` and renamed to
  ``step-N`` only when complete (``os.rename`` is atomic), so a ``step-N`` folder is
  always whole; temp folders left by a killed run are removed on the next start;
- a step *commits* by (1) renaming its checkpoint into place, then (2) appending its
  metrics line. On resume, ``metrics.jsonl`` is rebuilt from the lines of steps up to the
  last checkpoint (a torn last line is dropped, any line after the checkpoint is dropped
  because that step reruns, and a line missing between (1) and (2) comes back from the
  checkpoint's own ``metrics.json``). So every step appears exactly once, whatever the
  instant of the kill.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

CHECKPOINT = re.compile(r"^step-(\d+)$")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file, fsync and rename (never a torn file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Resume:
    """Where a rerun continues: the last complete checkpoint."""

    step: int
    path: Path

    @property
    def policy_path(self) -> Path:
        return self.path / "policy"


class RunDir:
    """A training run's directory (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"
        self.config_path = self.path / "config.yaml"

    # -- start / resume
    def start(self, config_yaml: str, *, compare: Callable[[str, str], list[str]] | None = None) -> Resume | None:
        """Create the directory or pick it up again.

        Writes ``config.yaml`` on a fresh start. On a rerun the stored config must match
        (``compare(stored, new)`` returns the differing keys; any raises ``ValueError``
        naming them). Returns the last complete checkpoint, or ``None`` to start at step 1.
        """
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        if self.config_path.exists():
            stored = self.config_path.read_text()
            differ = compare(stored, config_yaml) if compare else ([] if stored == config_yaml else ["config"])
            if differ:
                raise ValueError(f"run dir {str(self.path)!r} was started with another config ({', '.join(differ)}); "
                                 "use a new run_dir, or rerun with the same config to resume")
        else:
            atomic_write_text(self.config_path, config_yaml)
        for stale in self.checkpoints.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        resume = self.last_checkpoint()
        self._reconcile_metrics(resume)
        return resume

    def last_checkpoint(self) -> Resume | None:
        steps = [int(m.group(1)) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name))] \
            if self.checkpoints.exists() else []
        if not steps:
            return None
        step = max(steps)
        return Resume(step, self.checkpoints / f"step-{step}")

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metrics lines (a torn or unparsable line is skipped)."""
        if not self.metrics_path.exists():
            return []
        out = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                out.append(record)
        return out

    def _reconcile_metrics(self, resume: Resume | None) -> None:
        last = resume.step if resume else 0
        by_step: dict[int, dict] = {}
        for record in self.read_metrics():
            if record["step"] <= last:
                by_step.setdefault(record["step"], record)
        if resume is not None and last not in by_step and (resume.path / "metrics.json").exists():
            by_step[last] = json.loads((resume.path / "metrics.json").read_text())
        text = "".join(json.dumps(by_step[s]) + "\n" for s in sorted(by_step))
        current = self.metrics_path.read_text() if self.metrics_path.exists() else ""
        if text != current:
            atomic_write_text(self.metrics_path, text)

    # -- commit a step
    def commit(self, step: int, record: dict[str, Any], write_checkpoint: Callable[[Path], None] | None,
               keep: int = 2) -> None:
        """Finish ``step``: write its checkpoint (when ``write_checkpoint`` is given) atomically,
        then append its metrics line; keep the newest ``keep`` checkpoints."""
        if write_checkpoint is not None:
            final = self.checkpoints / f"step-{step}"
            tmp = self.checkpoints / f".tmp-step-{step}-{os.getpid()}"
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
            write_checkpoint(tmp)
            (tmp / "metrics.json").write_text(json.dumps(record))
            for f in tmp.rglob("*"):
                if f.is_file():
                    with open(f, "rb") as handle:
                        os.fsync(handle.fileno())
            if final.exists():  # a rerun of a step whose checkpoint was written (same content)
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.checkpoints)
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if write_checkpoint is not None and keep > 0:
            steps = sorted(int(m.group(1)) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name)))
            for old in steps[:-keep]:
                shutil.rmtree(self.checkpoints / f"step-{old}", ignore_errors=True)

    def checkpoint_path(self, step: int | None = None) -> Path:
        """``checkpoints/step-N`` (the latest when ``step`` is None); ValueError when absent."""
        if step is None:
            last = self.last_checkpoint()
            if last is None:
                raise ValueError(f"run dir {str(self.path)!r} has no checkpoint")
            return last.path
        path = self.checkpoints / f"step-{step}"
        if not path.exists():
            have = sorted(int(m.group(1)) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name)))
            raise ValueError(f"run dir {str(self.path)!r} has no checkpoint for step {step}; it has {have}")
        return path


# ---------------------------------------------------------------------- predictor state
def predictor_state(predictor: Any) -> dict[str, Any]:
    """What makes a predictor resume where it was: its ``state_dict()`` when it has one,
    else the trainable parts the project's predictors hold (``head``, ``optimizer``, and the
    ``backbone`` when it is trained). A predictor with none of them has no state."""
    if hasattr(predictor, "state_dict"):
        return {"state_dict": predictor.state_dict()}
    out = {}
    for name in ("head", "optimizer"):
        part = getattr(predictor, name, None)
        if part is not None and hasattr(part, "state_dict"):
            out[name] = part.state_dict()
    if getattr(predictor, "train_backbone", False):
        out["backbone"] = predictor.backbone.state_dict()
    return out


def load_predictor_state(predictor: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`predictor_state`."""
    if "state_dict" in state:
        predictor.load_state_dict(state["state_dict"])
        return
    for name, value in state.items():
        getattr(predictor, name).load_state_dict(value)
