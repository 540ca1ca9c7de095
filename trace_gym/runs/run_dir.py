"""Run directories: the resolved config, one metrics line per step, atomic checkpoints, resume.

Layout of a run directory::

    config.yaml              the resolved config (written once; a rerun must match it)
    metrics.jsonl            one JSON object per finished step, in step order
    checkpoints/step-N/      policy/ (HF weights + tokenizer), trainer.pt (optimizer, schedule),
                             predictor.pt, rng.pt, state.json (step, data cursor),
                             metrics.json (step N's metrics line),
                             manifest.json (every other file's size and SHA-256; written last)
                             (only the newest keeps trainer.pt, predictor.pt and rng.pt: the
                             older ones are weights-only, manifest ``"resumable": false``)
    evals/step-N.json        evaluations run during training
    .lock                    held (``flock``) by the one run using the directory

Crash safety (SIGKILL at any instant):

- a checkpoint is written into ``checkpoints/.tmp-step-N-<pid>`` and renamed to
  ``step-N`` only when complete (``os.rename`` is atomic), so a ``step-N`` folder is
  always whole; temp folders left by a killed run are removed on the next start;
- a checkpoint counts only when its ``manifest.json`` matches what is on disk
  (:func:`~trace_gym.runs.checkpoint.verify_checkpoint`): it lists every file present and
  nothing else, at least the files every step of the run writes (``step_files``: a
  manifest listing ``"files": {}`` does not make an empty step complete), each with its
  size and SHA-256, no link anywhere, and ``state.json`` / ``metrics.json`` of its step.
  Since a checkpoint is renamed into place whole, a ``step-N`` that fails its manifest
  was changed by something else (an editor, another tool, a bad copy); resume (and
  ``eval --policy RUN``) then refuses in one line naming the step, the reason and how to go
  on, and moves nothing: a run's trained state is the most expensive thing its user has;
- a checkpoint is read-only to every reader (resume, ``eval``, ``compare``, ``bench``,
  ``bank record``): nothing but its run writes into it, and readers' caches live in the
  trace_gym cache (the weights hash: :mod:`trace_gym.runs.weights`);
- one run at a time: :meth:`RunDir.start` takes an exclusive lock on ``.lock`` (released
  when the process ends, however it ends); a second run on the same directory is refused
  in one line naming the holder's pid, host and start time;
- what a run reads and writes lies inside what it locks: ``.lock`` is never opened
  through a link, and an entry of the run dir that the run uses (``config.yaml``,
  ``metrics.jsonl``, ``checkpoints/`` and each folder in it, ``evals/`` and each file in
  it, ``tb/``) that a link takes outside the directory (``checkpoints/`` linked into
  another run's) is refused at start, naming the link;
- every run file is read bounded and total (:mod:`trace_gym.runs.files`): a manifest,
  ``state.json`` or ``metrics.json`` too large, too deep or of the wrong shape makes its
  checkpoint incomplete (a reason, never a raw ``RecursionError`` or ``AttributeError``),
  and a ``metrics.jsonl`` line that is torn, too long, too deep or holds a 5000-digit
  number is skipped;
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
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from trace_gym.runs.checkpoint import (CHECKPOINT, COMMIT_FILES, drop_checkpoint_files, is_resumable,
                                      verify_checkpoint, write_manifest)
from trace_gym.runs.files import (atomic_write_text, exclusive_lock, is_step, iter_json_lines, link_outside, open_regular,
                                  read_json_file, release_lock)

LOCK = ".lock"
#: The entries of a run dir a run reads or writes (each must stay inside the directory it locks).
RUN_ENTRIES = (LOCK, "config.yaml", "metrics.jsonl", "checkpoints", "evals", "tb", "wandb", "mlruns")
#: Largest ``config.yaml`` a rerun reads back, bytes.
MAX_CONFIG_BYTES = 1 << 20


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
    #: False for a weights-only checkpoint (:meth:`RunDir.drop_files`): nothing to resume from
    resumable: bool = True

    @property
    def policy_path(self) -> Path:
        return self.path / "policy"


class RunDir:
    """A training run's directory (see the module docstring).

    Args:
        path: the run dir.
        step_files: patterns of the files every checkpoint of this run holds (the training
            loop passes :data:`~trace_gym.runs.checkpoint.TRAINING_STEP_FILES`; default:
            what :meth:`commit` writes).
    """

    def __init__(self, path: str | Path, step_files: Sequence[str] = COMMIT_FILES):
        self.path = Path(path)
        self.step_files = tuple(step_files)
        self.checkpoints = self.path / "checkpoints"
        self.metrics_path = self.path / "metrics.jsonl"
        self.config_path = self.path / "config.yaml"
        self._lock: Any = None  # the open .lock file while this object holds it

    # -- one run at a time
    def lock(self) -> None:
        """Take the directory's exclusive lock (idempotent), or raise ``ValueError`` naming
        the run that holds it (:func:`~trace_gym.runs.files.exclusive_lock`)."""
        if self._lock is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = exclusive_lock(self.path / LOCK, f"run dir {str(self.path)!r}",
                                    "wait for that run to end, or use another run_dir")

    def close(self) -> None:
        """Release the lock (it is released too when this object is collected or the process ends)."""
        release_lock(self._lock, self.path / LOCK)
        self._lock = None

    # -- start / resume
    def start(self, config_yaml: str, *, compare: Callable[[str, str], list[str]] | None = None) -> Resume | None:
        """Create the directory or pick it up again.

        Writes ``config.yaml`` on a fresh start. On a rerun the stored config must match
        (``compare(stored, new)`` returns the differing keys; any raises ``ValueError``
        naming them). Returns the newest checkpoint, checked by SHA-256, or ``None`` to
        start at step 1. Takes the lock first (:meth:`lock`); removes the temp folders a
        killed run left, and nothing else.

        Raises:
            ValueError: another config, or the newest ``step-N`` is not as the run wrote it
                (:meth:`last_checkpoint`; nothing is moved).
        """
        self.lock()
        self._check_inside()
        self.checkpoints.mkdir(exist_ok=True)
        if self.config_path.exists():
            differ = self._config_differences(config_yaml, compare)
            if differ:
                raise ValueError(f"run dir {str(self.path)!r} was started with another config ({', '.join(differ)}); "
                                 "use a new run_dir, or rerun with the same config to resume")
        else:
            atomic_write_text(self.config_path, config_yaml)
        for stale in self.checkpoints.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        resume = self.last_checkpoint(hashes=True)
        self._reconcile_metrics(resume)
        return resume

    def _check_inside(self) -> None:
        """``ValueError`` naming the link when an entry the run reads or writes
        (:data:`RUN_ENTRIES`, and what ``checkpoints/`` and ``evals/`` hold) leads outside
        the directory this run locks."""
        entries = [self.path / name for name in RUN_ENTRIES]
        for entry in entries[:]:
            if entry.name in ("checkpoints", "evals") and entry.is_dir() and link_outside(self.path, entry) is None:
                entries += sorted(entry.iterdir())
        for entry in entries:
            target = link_outside(self.path, entry)
            if target is not None:
                raise ValueError(f"run dir {str(self.path)!r}: {entry.relative_to(self.path).as_posix()} leads to "
                                 f"{target}, outside the directory this run locks; a run reads and writes only inside "
                                 "its own run dir (remove the link, or run in that directory)")

    def _config_differences(self, config_yaml: str, compare: Callable[[str, str], list[str]] | None) -> list[str]:
        """The keys in which the stored ``config.yaml`` (read bounded) differs from ``config_yaml``;
        ``ValueError`` naming the file when it cannot be read or compared."""
        import yaml

        with open_regular(self.config_path) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        try:
            if len(data) > MAX_CONFIG_BYTES:
                raise ValueError(f"more than {MAX_CONFIG_BYTES:,} bytes")
            stored = data.decode("utf-8")
            return compare(stored, config_yaml) if compare else ([] if stored == config_yaml else ["config"])
        except (ValueError, TypeError, AttributeError, RecursionError, yaml.YAMLError) as exc:  # what a bad file raises
            raise ValueError(f"run dir {str(self.path)!r}: config.yaml is unreadable ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); use a new run_dir") from None

    def _steps(self) -> list[int]:
        return [int(m.group(1)) for p in self.checkpoints.iterdir() if (m := CHECKPOINT.match(p.name))] \
            if self.checkpoints.exists() else []

    def last_checkpoint(self, *, hashes: bool = False) -> Resume | None:
        """The newest checkpoint (``step-N`` of the largest N), checked against its manifest
        by size (with ``hashes``, by SHA-256 too); ``None`` when the run has none.

        Raises:
            ValueError: that folder is not as the run wrote it: one line naming the step,
                what differs and how to go on (:meth:`_touched`); an older step is never
                taken in its place, and nothing is moved.
        """
        steps = sorted(self._steps())
        if not steps:
            return None
        folder = self.checkpoints / f"step-{steps[-1]}"
        reason = verify_checkpoint(folder, steps[-1], hashes=hashes, required=self.step_files)
        if reason is not None:
            raise ValueError(self._touched(steps[-1], reason, steps[:-1]))
        return Resume(steps[-1], folder, is_resumable(folder))

    def _touched(self, step: int, reason: str, older: Sequence[int]) -> str:
        """The refusal of a ``step-N`` that fails its manifest. A run renames each checkpoint
        into place whole, so such a folder was changed by something else; the user decides
        what happens to it (moving it aside silently lost a run's trained weights after one
        evaluation wrote a memo into them)."""
        before = next((s for s in reversed(older) if verify_checkpoint(
            self.checkpoints / f"step-{s}", s, hashes=False, required=self.step_files) is None), None)
        then = f"step-{before} is then the newest" if before is not None else "no checkpoint is then left: step 1 next"
        return (f"run dir {str(self.path)!r}: checkpoints/step-{step} is not as the run wrote it: {reason}; a trained "
                f"checkpoint is never moved or deleted for you: undo that change (remove a file the run did not "
                f"write, restore one it did), or move checkpoints/step-{step} out of checkpoints/ yourself ({then})")

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metrics lines, read bounded (:func:`~trace_gym.runs.files.iter_json_lines`): a
        torn, overlong, too deep or unparsable line, or one that is not an object with an
        integer ``step`` in 0..2**53, is skipped."""
        if not self.metrics_path.exists():
            return []
        return [r for r in iter_json_lines(self.metrics_path) if type(r) is dict and is_step(r.get("step"))]

    def _reconcile_metrics(self, resume: Resume | None) -> None:
        last = resume.step if resume else 0
        by_step: dict[int, dict] = {}
        for record in self.read_metrics():
            if record["step"] <= last:
                by_step.setdefault(record["step"], record)
        if resume is not None and last not in by_step and (resume.path / "metrics.json").exists():
            by_step[last] = read_json_file(resume.path / "metrics.json")  # checked by verify_checkpoint
        text = "".join(json.dumps(by_step[s]) + "\n" for s in sorted(by_step)).encode()
        same = self.metrics_path.exists() and self.metrics_path.stat().st_size == len(text) \
            and self.metrics_path.read_bytes() == text
        if not same:
            atomic_write_text(self.metrics_path, text.decode())

    # -- commit a step
    def commit(self, step: int, record: dict[str, Any], write_checkpoint: Callable[[Path], None] | None,
               keep: int = 2, drop_superseded: Sequence[str] = ()) -> None:
        """Finish ``step``: write its checkpoint (when ``write_checkpoint`` is given) atomically,
        then append its metrics line; keep the newest ``keep`` checkpoints, and drop the files
        matching ``drop_superseded`` (what only a resume reads) from every older one kept."""
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
        fd = os.open(self.metrics_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if write_checkpoint is not None and keep > 0:
            steps = sorted(self._steps())
            for old in steps[:-keep]:
                shutil.rmtree(self.checkpoints / f"step-{old}", ignore_errors=True)
        if write_checkpoint is not None and drop_superseded:
            for old in sorted(self._steps())[:-1]:
                self.drop_files(old, drop_superseded)

    def drop_files(self, step: int, patterns: Sequence[str]) -> list[str]:
        """Make ``checkpoints/step-N`` weights-only: its files matching ``patterns`` leave the
        manifest, then the disk (:func:`~trace_gym.runs.checkpoint.drop_checkpoint_files`); a
        checkpoint that is not complete is left as it is. Returns the names dropped."""
        folder = self.checkpoints / f"step-{step}"
        if verify_checkpoint(folder, step, hashes=False) is not None:
            return []
        return drop_checkpoint_files(folder, step, patterns)

    def checkpoint_path(self, step: int | None = None) -> Path:
        """``checkpoints/step-N`` (the latest when ``step`` is None), its files checked
        against its manifest by content (SHA-256: a policy is loaded from it, and a
        same-size edit must not pass); ValueError when absent or changed. Reads only."""
        if step is None:
            last = self.last_checkpoint(hashes=True)
            if last is None:
                raise ValueError(f"run dir {str(self.path)!r} has no checkpoint")
            return last.path
        path = self.checkpoints / f"step-{step}"
        if not path.exists():
            raise ValueError(f"run dir {str(self.path)!r} has no checkpoint for step {step}; it has "
                             f"{sorted(self._steps())}")
        reason = verify_checkpoint(path, step, hashes=True, required=self.step_files)
        if reason is not None:
            raise ValueError(f"{path} is not a complete checkpoint: {reason}")
        return path
