"""A checkpoint's rules: what ``checkpoints/step-N`` of a run dir holds, and when it counts.

:class:`~trace_gym.runs.run_dir.RunDir` writes one checkpoint per committed step and reads
them back through these rules (the run dir's layout and crash safety: its docstring):

- :func:`write_manifest`, :func:`verify_checkpoint`: a checkpoint counts only when its
  manifest lists exactly the plain files present (no link, nothing unlisted), at least the
  files every step writes (``required``: :data:`TRAINING_STEP_FILES` for a training step),
  each with its size and SHA-256, and its ``state.json`` / ``metrics.json`` are of its step;
- :func:`drop_checkpoint_files`, :func:`is_resumable`: an older checkpoint made weights-only
  (its manifest marked ``"resumable": false``), and telling one;
- :func:`read_state`, :func:`state_problem`, :func:`listed_sha256`: what a resume and a
  policy loader read from one, checked;
- :func:`predictor_state`, :func:`load_predictor_state`: the predictor's part of it.

Every file is read bounded (:mod:`trace_gym.runs.files`).
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping, Sequence

from trace_gym.runs.files import atomic_write_text, is_step, read_json_file, sha256_file

MANIFEST = "manifest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: What ``eval`` wrote into a checkpoint's ``policy/`` before issue 41 (the memo now lives in
#: the cache: :mod:`trace_gym.runs.weights`); a run dir evaluated then still holds it.
OLD_EVAL_MEMO = ".trace_gym_weights_hash.json"
CHECKPOINT = re.compile(r"step-(0|[1-9][0-9]{0,14})\Z")  # the names the run writes: "step-007", "step-4\n" are not
#: The files every checkpoint of a training step holds (``trace_gym.train.loop`` writes them;
#: patterns relative to the step folder; the sharded trainer writes ``trainer-rank*.pt``).
TRAINING_STEP_FILES = ("policy/config.json", "policy/*.safetensors", "trainer*.pt", "predictor.pt", "rng.pt",
                       "state.json", "metrics.json")
#: What :meth:`RunDir.commit` itself writes into every checkpoint.
COMMIT_FILES = ("metrics.json",)


def write_manifest(folder: Path, step: int) -> None:
    """Record every file under ``folder`` (size, SHA-256) in its ``manifest.json``, last."""
    files = {f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": sha256_file(f)}
             for f in sorted(folder.rglob("*")) if f.is_file() and f.name != MANIFEST}
    atomic_write_text(folder / MANIFEST, json.dumps({"step": step, "complete": True, "files": files}, indent=1))


def drop_checkpoint_files(folder: Path, step: int, patterns: Sequence[str]) -> list[str]:
    """Make a complete checkpoint weights-only: the listed files matching ``patterns`` leave
    the manifest (rewritten atomically first, marked ``"resumable": false`` with the names
    under ``"dropped"``), then the files are deleted. Idempotent; killed between the two, the
    checkpoint is still complete (a dropped name may remain on disk until the next call).
    Returns the names dropped (none when nothing matched)."""
    manifest = read_json_file(folder / MANIFEST)
    if _manifest_problem(manifest, step):
        return []
    files, dropped = dict(manifest["files"]), list(manifest.get("dropped") or [])
    names = [n for n in files if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if names:
        manifest = {**manifest, "resumable": False, "files": {n: e for n, e in files.items() if n not in names},
                    "dropped": sorted(set(dropped) | set(names))}
        atomic_write_text(folder / MANIFEST, json.dumps(manifest, indent=1))
    for name in manifest.get("dropped") or []:
        if type(name) is str and "/" not in name and name != MANIFEST:
            (folder / name).unlink(missing_ok=True)
    return names


def is_resumable(folder: Path) -> bool:
    """Whether a checkpoint still holds its resume state (its manifest is not marked
    ``"resumable": false`` by :func:`drop_checkpoint_files`)."""
    try:
        return read_json_file(folder / MANIFEST).get("resumable", True) is not False
    except (OSError, ValueError, AttributeError):
        return False


def _dropped(manifest: Mapping[str, Any]) -> list[str]:
    """The names a weights-only manifest dropped (top-level file names only; else none)."""
    names = manifest.get("dropped") if manifest.get("resumable") is False else None
    if type(names) is not list:
        return []
    return [n for n in names if type(n) is str and n and "/" not in n and n not in (MANIFEST, ".", "..")]


def _shown(name: str) -> str:
    """A file name as a one-line reason shows it: as is, or quoted when it holds a newline or
    another character that is not printable."""
    return name if name.isprintable() else repr(name)


def _plain_files(folder: Path) -> tuple[dict[str, Path], str | None]:
    """``({relative name: path} of the files under folder, None)``, or the reason the folder
    holds something a checkpoint never does (a link, a device, a pipe)."""
    files: dict[str, Path] = {}
    for top, dirs, names in os.walk(folder, followlinks=False):
        for name in [*dirs, *names]:
            path = Path(top) / name
            rel = path.relative_to(folder).as_posix()
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                return files, f"{_shown(rel)} is a link (to {_shown(os.readlink(path))}); a checkpoint holds plain " \
                              "files only"
            if name in names:
                if not stat.S_ISREG(mode):
                    return files, f"{_shown(rel)} is not a regular file"
                files[rel] = path
    return files, None


def _manifest_problem(manifest: Any, step: int) -> str | None:
    """Why ``manifest`` is not a complete manifest of ``step``, naming the field, else ``None``."""
    if type(manifest) is not dict:
        return f"{MANIFEST} is a {type(manifest).__name__}, expected an object"
    if manifest.get("complete") is not True:
        return f"{MANIFEST} is not marked complete"
    if not is_step(manifest.get("step")) or manifest["step"] != step:
        return f"{MANIFEST} is of step {manifest.get('step')!r:.40}"
    files = manifest.get("files")
    if type(files) is not dict:
        return f"{MANIFEST}'s files is {type(files).__name__ if 'files' in manifest else 'missing'}, expected an object"
    for name, entry in files.items():
        parts = name.split("/")
        if not name or name == MANIFEST or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return f"{MANIFEST} lists {name!r:.80}, not a file inside the checkpoint"
        if type(entry) is not dict or not is_step(entry.get("size")) or type(entry.get("sha256")) is not str \
                or not _SHA256.fullmatch(entry["sha256"]):
            return f"{MANIFEST}'s entry of {name!r:.80} is {entry!r:.80}, expected {{'size': bytes, 'sha256': hex}}"
    return None


def state_problem(state: Any, step: int, *, cursor: bool = False) -> str | None:
    """Why ``state`` (a parsed ``state.json``) is not the state of ``step``: an object with
    ``step``, and when present (required with ``cursor``) ``cursor`` = ``{"epoch",
    "position"}`` counts and ``fallback_first`` a bool; else ``None``."""
    if type(state) is not dict:
        return f"state.json is a {type(state).__name__}, expected an object"
    if not is_step(state.get("step")) or state["step"] != step:
        return f"state.json is of step {state.get('step')!r:.40}, expected {step}"
    if cursor or "cursor" in state:
        c = state.get("cursor")
        if type(c) is not dict or not is_step(c.get("epoch")) or not is_step(c.get("position")):
            return f"state.json's cursor is {c!r:.80}, expected {{'epoch': count, 'position': count}}"
    if type(state.get("fallback_first", False)) is not bool:
        return f"state.json's fallback_first is {state['fallback_first']!r:.40}, expected true or false"
    return None


def _step_files_problem(folder: Path, step: int, files: Mapping[str, Any]) -> str | None:
    """Why the checkpoint's own JSON files (``state.json``, ``metrics.json``) are not of ``step``."""
    for name in ("state.json", "metrics.json"):
        if name not in files:
            continue
        try:
            value = read_json_file(folder / name)
        except (OSError, ValueError) as exc:
            return f"{name} is unreadable ({exc})"
        problem = state_problem(value, step) if name == "state.json" else (
            None if type(value) is dict and value.get("step") == step and is_step(value.get("step"))
            else f"metrics.json is not the metrics line of step {step}")
        if problem:
            return problem
    return None


def verify_checkpoint(folder: Path, step: int, *, hashes: bool = True,
                      required: Sequence[str] = ("metrics.json",)) -> str | None:
    """Why ``folder`` is not a complete checkpoint of ``step`` (naming the file), or ``None``.

    Complete: ``folder`` and everything in it are plain (no link anywhere); its manifest
    (read bounded) is of ``step`` and marked complete; it lists every file present and
    nothing else; at least one listed file matches each pattern of ``required`` (the files
    every step writes: a manifest listing ``{}`` does not make a step); each file has the
    listed size (and, with ``hashes``, SHA-256); ``state.json`` and ``metrics.json`` are
    of ``step``.
    """
    if os.path.islink(folder):
        return f"the folder is a link (to {_shown(os.readlink(folder))}); a checkpoint holds plain files only"
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return f"no {MANIFEST} (an incomplete or foreign folder)"
    present, odd = _plain_files(folder)
    if odd:
        return odd
    try:
        manifest = read_json_file(manifest_path)
    except (OSError, ValueError) as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    problem = _manifest_problem(manifest, step)
    if problem:
        return problem
    files = manifest["files"]
    dropped = set(_dropped(manifest))  # a weights-only checkpoint: these went on purpose
    unlisted = sorted(set(present) - set(files) - {MANIFEST} - dropped)
    if unlisted:
        old_memo = " (the weights-hash memo eval wrote there before issue 41: safe to remove)" \
            if unlisted[0].rpartition("/")[2] == OLD_EVAL_MEMO else ""
        return f"{_shown(unlisted[0])} is not listed in {MANIFEST}{old_memo} (a checkpoint holds what its manifest " \
               "lists, nothing else)"
    for pattern in required:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in [*files, *dropped]):
            return f"{MANIFEST} lists no {pattern} (every checkpoint of this run holds one)"
    for name, entry in files.items():
        path = present.get(name)
        if path is None:
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{name} has {size} bytes, the manifest says {entry['size']}"
        if hashes and sha256_file(path) != entry["sha256"]:
            return f"{name} differs from the manifest (SHA-256)"
    return _step_files_problem(folder, step, files)


def listed_sha256(folder: Path, under: str) -> dict[str, str]:
    """``{name inside under/: sha256 hex}`` of the files a checkpoint's manifest lists in its
    sub-folder ``under`` (``"policy"``: the weights), so a caller that has just checked the
    checkpoint by content (:func:`verify_checkpoint` with ``hashes``) need not hash them
    again; ``{}`` when the manifest is unreadable or of the wrong shape."""
    try:
        manifest = read_json_file(folder / MANIFEST)
    except (OSError, ValueError):
        return {}
    files = manifest.get("files") if type(manifest) is dict else None
    prefix = under.strip("/") + "/"
    return {name[len(prefix):]: entry["sha256"] for name, entry in (files if type(files) is dict else {}).items()
            if name.startswith(prefix) and type(entry) is dict and type(entry.get("sha256")) is str}


def read_state(folder: Path, step: int) -> dict[str, Any]:
    """A training checkpoint's ``state.json`` (bounded, checked: :func:`state_problem` with
    its cursor); ``ValueError`` naming the file and the field."""
    try:
        state = read_json_file(folder / "state.json")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: state.json is unreadable ({exc})") from None
    problem = state_problem(state, step, cursor=True)
    if problem:
        raise ValueError(f"{folder}: {problem}")
    return state


# ---------------------------------------------------------------------- predictor state
def predictor_state(predictor: Any) -> dict[str, Any]:
    """What makes a predictor resume where it was: its ``state_dict()`` (the
    :class:`~trace_gym.predictor.kinds.SuccessPredictor` Protocol: head, optimiser, memory, evidence).

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
                        "restore it (the SuccessPredictor Protocol, trace_gym/predictor/kinds.py)")


def load_predictor_state(predictor: Any, state: dict[str, Any]) -> None:
    """Inverse of :func:`predictor_state`. A checkpoint written before predictors had memory
    (``head``/``optimizer`` entries) restores those parts; its memory starts empty."""
    if "state_dict" in state:
        predictor.load_state_dict(state["state_dict"])
        return
    for name, value in state.items():
        getattr(predictor, name).load_state_dict(value)
