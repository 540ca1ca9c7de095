"""The one resolver of ``--policy`` / ``policy=``: a model name, a model folder, a hub id or
a training run's checkpoint (``RUN[@STEP]``, or the checkpoint's own folder
``RUN/checkpoints/step-N[/policy]``, which is ``RUN@N``).

Every command that takes a policy (``train`` and ``train --dry-run``, ``bench --env``,
``bank record``, ``eval``) resolves it through :func:`find_policy` before it writes
anything or loads a model, so a bad value is one line naming it (exit 2) and leaves no
run dir or output folder behind. :func:`find_policy` pulls and downloads nothing;
:meth:`Policy.folder` does, when the weights are needed.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Policy:
    """A resolved policy reference.

    Attributes:
        spec: the value as the user gave it.
        ref: what the engines and the trainer load (:func:`trace_gym.models.resolve_model`):
            ``spec`` itself for a model name, folder or hub id; a run's checkpoint
            ``policy/`` folder for ``RUN[@STEP]``.
        label: the name reports show (``RUN@STEP`` for a checkpoint, however it was named).
        base: ``True`` for a model (no RL here), ``False`` for a training run's checkpoint.
        file_sha256: ``(name, sha256)`` of each file of a checkpoint's ``policy/`` as its
            manifest lists them, checked against the files by content when resolved (so
            :meth:`weights_hash` need not read them again); empty for a model.
    """

    spec: str
    ref: str
    label: str
    base: bool
    file_sha256: tuple[tuple[str, str], ...] = ()

    def folder(self) -> Path:
        """The local weights folder (pulls a known model, downloads a hub id; a checkpoint's
        folder as its run dir's manifest vouches for it)."""
        from trace_gym.models import resolve_model

        return Path(resolve_model(self.ref)) if self.base else Path(self.ref)

    def weights_hash(self) -> str:
        """:func:`trace_gym.runs.weights.weights_hash` of :meth:`folder` (a checkpoint's from its
        verified manifest); writes nothing into the folder."""
        from trace_gym.runs.weights import weights_hash

        return weights_hash(self.folder(), known=dict(self.file_sha256))


def is_run_dir(path: Path) -> bool:
    """A training run directory: ``config.yaml`` and ``checkpoints/``."""
    return (path / "config.yaml").exists() and (path / "checkpoints").exists()


def find_policy(spec: str, *, key: str = "policy") -> Policy:
    """The :class:`Policy` of a model name / folder / hub id / ``RUN[@STEP]`` / a checkpoint's
    folder, without pulling, downloading, loading or writing anything (a checkpoint's files
    are read once, to check them against its manifest by SHA-256).

    Raises:
        ValueError: a spec that is none of these (``org/name`` whose ``org/`` is a folder
            here is a missing path, not a hub id), or a checkpoint that is not as its run
            wrote it: one line naming ``key`` and the value (with the closest names).
    """
    from trace_gym.utils.suggest import did_you_mean
    from trace_gym.models import MODELS, locate_model, missing_local_path

    spec = str(spec)
    path, step = _split_step(spec, key)
    run = Path(os.path.expanduser(path))
    if not step and (inside := checkpoint_of(run)) is not None:
        run, step = inside  # a step folder of a run (or its policy/): that run's checkpoint, RUN@N
    if is_run_dir(run):
        if step and not (step.isascii() and step.isdigit() and len(step) <= 15):
            raise ValueError(f"{key} {spec[:200]!r}: the step after @ must be an integer of at most 15 digits")
        if not (run / "checkpoints").is_dir():
            raise ValueError(f"{key} {spec[:200]!r}: {str(run)!r} looks like a run dir, but its checkpoints is not "
                             "a folder")
        return _checkpoint_policy(spec, run, int(step) if step else None)
    if step:
        raise ValueError(f"{key} {spec!r}: {path!r} is not a run directory (no config.yaml + checkpoints/)")
    try:
        locate_model(path)
    except FileNotFoundError:
        if run.is_dir():
            raise ValueError(f"{key} {spec!r}: the folder is neither a model (no config.json) nor a run dir "
                             "(no config.yaml + checkpoints/)") from None
        local = missing_local_path(path)
        if local is not None:
            raise ValueError(f"{key} {spec!r}: no model folder or run dir there ({local})") from None
        raise ValueError(f"{key} {spec!r} is neither a model folder, a run dir nor a known model name"
                         f"{did_you_mean(path, sorted(MODELS))}; known: {sorted(MODELS)}") from None
    return Policy(spec, path, path, True)


def _split_step(spec: str, key: str) -> tuple[str, str]:
    """``(path, step)`` of ``RUN@STEP`` (``step`` empty without one). A spec that names an
    existing path whole is that path, ``@`` and all (a model folder ``models/qwen@v2``);
    else it splits at its last ``@`` (a run dir may hold one: ``runs/a@b@3``).

    Raises:
        ValueError: ``~user`` names no user of this machine.
    """
    head = spec.split("/", 1)[0]
    if head.startswith("~") and os.path.expanduser(head) == head:
        raise ValueError(f"{key} {spec[:200]!r}: {head!r} names no user of this machine (~ is your home, ~NAME "
                         "that user's)")
    if os.path.lexists(os.path.expanduser(spec)):
        return spec, ""
    path, at, step = spec.rpartition("@")
    return (path, step) if at else (spec, "")


def checkpoint_of(path: Path) -> tuple[Path, str] | None:
    """``(run dir, step)`` when ``path`` is a run's checkpoint folder ``RUN/checkpoints/step-N``
    or its ``policy/`` folder, else ``None``."""
    from trace_gym.runs.checkpoint import CHECKPOINT

    folder = Path(os.path.abspath(path))  # "step-2/policy/." and "step-2/policy/../policy" spelled out
    folder = folder.parent if folder.name == "policy" else folder
    match = CHECKPOINT.match(folder.name)
    run = folder.parent.parent
    if match is None or folder.parent.name != "checkpoints" or not is_run_dir(run):
        return None
    return (run if path.is_absolute() else Path(os.path.relpath(run))), match.group(1)  # the ref as the user spelt it


def _checkpoint_policy(spec: str, run: Path, step: int | None) -> Policy:
    """The :class:`Policy` of ``run``'s checkpoint ``step`` (the newest when ``None``), its
    files checked by SHA-256 against its manifest (:meth:`RunDir.checkpoint_path`: reads only)."""
    from trace_gym.runs.run_dir import RunDir
    from trace_gym.runs.checkpoint import listed_sha256

    ckpt = RunDir(run).checkpoint_path(step)
    hashes = tuple(sorted(listed_sha256(ckpt, "policy").items()))
    label = f"{Path(os.path.abspath(run)).name}@{ckpt.name.split('-')[1]}"  # "." is named too
    return Policy(spec, str(ckpt / "policy"), label, False, hashes)


def resolve_policy(spec: str) -> tuple[Path, str, bool]:
    """``(weights folder, label, is_base_model)`` of ``spec`` (:func:`find_policy`, then the
    weights fetched where they are not local yet).

    Raises:
        ValueError: as :func:`find_policy`, or a hub id that cannot be fetched.
    """
    policy = find_policy(spec)
    return policy.folder(), policy.label, policy.base


def with_policy(cfg: Any, *, key: str = "policy") -> Any:
    """``cfg`` (a config dataclass) with its ``key`` field resolved by :func:`find_policy`:
    unchanged for a model name, folder or hub id; a run's checkpoint folder for ``RUN[@STEP]``.

    Raises:
        ValueError: a bad value (one line, see :func:`find_policy`).
    """
    policy = find_policy(getattr(cfg, key), key=key)
    return cfg if policy.ref == getattr(cfg, key) else dataclasses.replace(cfg, **{key: policy.ref})
