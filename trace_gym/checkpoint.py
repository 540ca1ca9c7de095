"""Run directories: the resolved config, one metrics line per step, atomic checkpoints, resume.

Layout of a run directory::

    config.yaml              the resolved config (written once; a rerun must match it)
    metrics.jsonl            one JSON object per finished step, in step order
    checkpoints/step-N/      policy/ (HF weights + tokenizer), trainer.pt (optimizer, schedule),
                             predictor.pt, state.json (step, RNG states, data cursor),
                             metrics.json (step N's metrics line),
                             manifest.json (every other file's size and SHA-256; written last)
    evals/step-N.json        evaluations run during training
    .lock                    held (``flock``) by the one run using the directory

Crash safety (SIGKILL at any instant):

- a checkpoint is written into ``checkpoints/.tmp-step-N-<pid>`` and renamed to
  ``step-N`` only when complete (``os.rename`` is atomic), so a ``step-N`` folder is
  always whole; temp folders left by a killed run are removed on the next start;
- a checkpoint counts only when its ``manifest.json`` matches what is on disk (every file
  present, with its size and SHA-256): resume takes the newest complete one, and a folder
  that is not (empty, a truncated weight file, a garbage ``state.json``) is moved aside to
  ``checkpoints/.invalid-step-N-<time>`` (kept, not deleted) and named, with the reason,
  in :attr:`RunDir.skipped`;
- one run at a time: :meth:`RunDir.start` takes an exclusive lock on ``.lock`` (released
  when the process ends, however it ends); a second run on the same directory is refused
  in one line naming the holder's pid, host and start time;
- a step *commits* by (1) renaming its checkpoint into place, then (2) appending its
  metrics line. On resume, ``metrics.jsonl`` is rebuilt from the lines of steps up to the
  last checkpoint (a torn last line is dropped, any line after the checkpoint is dropped
  because that step reruns, and a line missing between (1) and (2) comes back from the
  checkpoint's own ``metrics.json``). So every step appears exactly once, whatever the
  instant of the kill.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

CHECKPOINT = re.compile(r"^step-(\d+)$")
MANIFEST = "manifest.json"
LOCK = ".lock"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    """Record every file under ``folder`` (size, SHA-256) in its ``manifest.json``, last."""
    files = {str(f.relative_to(folder)): {"size": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST}
    atomic_write_text(folder / MANIFEST, json.dumps({"step": step, "complete": True, "files": files}, indent=1))


def verify_checkpoint(folder: Path, step: int, *, hashes: bool = True) -> str | None:
    """Why ``folder`` is not a complete checkpoint of ``step`` (naming the file), or
    ``None`` when its manifest matches the files (sizes always; contents with ``hashes``)."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return f"no {MANIFEST} (an incomplete or foreign folder)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files, recorded = manifest["files"], manifest["step"]
        if not (manifest.get("complete") is True and isinstance(files, dict)):
            raise ValueError("not marked complete")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})"
    if recorded != step:
        return f"{MANIFEST} is of step {recorded!r}"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry.get("size"):
            return f"{name} has {path.stat().st_size} bytes, the manifest says {entry.get('size')}"
        if hashes and _sha256(path) != entry.get("sha256"):
            return f"{name} differs from the manifest (SHA-256)"
    return None


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
        #: checkpoints :meth:`start` found incomplete: ``"step-9: no manifest.json ..."``
        self.skipped: list[str] = []
        self._lock: Any = None  # the open .lock file while this object holds it

    # -- one run at a time
    def lock(self) -> None:
        """Take the directory's exclusive lock (idempotent), or raise ``ValueError`` naming
        the run that holds it."""
        import fcntl

        if self._lock is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / LOCK, "a+b")  # noqa: SIM115  (held open for the run's life)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(handle.fileno(), 4096, 0).decode("utf-8", "replace").strip() or "another process"
            handle.close()
            raise ValueError(f"run dir {str(self.path)!r} is in use by {holder}; wait for that run to end, "
                             "or use another run_dir") from None
        handle.truncate(0)
        argv = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200]
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
                     f"({argv})\n".encode())
        handle.flush()
        self._lock = handle

    def close(self) -> None:
        """Release the lock (it is released too when this object is collected or the process ends)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # -- start / resume
    def start(self, config_yaml: str, *, compare: Callable[[str, str], list[str]] | None = None) -> Resume | None:
        """Create the directory or pick it up again.

        Writes ``config.yaml`` on a fresh start. On a rerun the stored config must match
        (``compare(stored, new)`` returns the differing keys; any raises ``ValueError``
        naming them). Returns the last complete checkpoint, or ``None`` to start at step 1;
        incomplete ones are moved aside and listed in :attr:`skipped`. Takes the lock first
        (:meth:`lock`).
        """
        self.lock()
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
        self.skipped = []
        for step in sorted(self._steps(), reverse=True):
            folder = self.checkpoints / f"step-{step}"
            reason = verify_checkpoint(folder, step)
            if reason is None:
                break
            aside = self.checkpoints / f".invalid-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(folder, aside)
            self.skipped.append(f"step-{step}: {reason} (moved to {aside.name})")
        resume = self.last_checkpoint()
        self._reconcile_metrics(resume)
        return resume

    def _steps(self) -> list[int]:
        return [int(m.group(1)) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name))] \
            if self.checkpoints.exists() else []

    def last_checkpoint(self) -> Resume | None:
        """The newest checkpoint whose manifest matches its files by size (``start``
        verifies contents too)."""
        for step in sorted(self._steps(), reverse=True):
            folder = self.checkpoints / f"step-{step}"
            if verify_checkpoint(folder, step, hashes=False) is None:
                return Resume(step, folder)
        return None

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
            write_manifest(tmp, step)
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
            steps = sorted(self._steps())
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
            raise ValueError(f"run dir {str(self.path)!r} has no checkpoint for step {step}; it has {sorted(self._steps())}")
        reason = verify_checkpoint(path, step, hashes=False)
        if reason is not None:
            raise ValueError(f"{path} is not a complete checkpoint: {reason}")
        return path


# ---------------------------------------------------------------------- predictor state
def predictor_state(predictor: Any) -> dict[str, Any]:
    """What makes a predictor resume where it was: its ``state_dict()`` (the
    :class:`~trace_gym.predictor.SuccessPredictor` Protocol: head, optimiser, memory, evidence).

    Raises:
        TypeError: the predictor has no ``state_dict``/``load_state_dict`` (a resume would
            silently start it afresh), naming its type.
    """
    require_predictor_state(predictor)
    return {"state_dict": predictor.state_dict()}


def require_predictor_state(predictor: Any) -> None:
    """``TypeError`` unless ``predictor`` can be checkpointed (has ``state_dict`` and ``load_state_dict``)."""
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(predictor, m, None))]
    if missing:
        raise TypeError(f"predictor {type(predictor).__name__} has no {' or '.join(missing)}: a checkpoint could not "
                        "restore it (the SuccessPredictor Protocol, trace_gym/predictor.py)")


def load_predictor_state(predictor: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`predictor_state`. A checkpoint written before predictors had memory
    (``head``/``optimizer`` entries) restores those parts; its memory starts empty."""
    if "state_dict" in state:
        predictor.load_state_dict(state["state_dict"])
        return
    for name, value in state.items():
        getattr(predictor, name).load_state_dict(value)
