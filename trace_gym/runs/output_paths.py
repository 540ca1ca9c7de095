"""Paths a command writes to: checked when it starts, and a last write that keeps the results.

A bench, an eval or a recording can run for hours before it writes its results; a path that
cannot take them (a folder where a file goes, a file where a folder goes, a parent that is a
file, a folder without write permission) must fail in one line when the command starts, not
after the work. :func:`check_output` is that check (:func:`check_config_outputs` runs it on
every field a config declares as an output, ``doc(..., output="folder")``).

The path can still change while the work runs (another job makes a folder there). Then
:func:`write_output_text` writes the text beside it instead (in the nearest existing folder,
else the working folder, else the temp folder) and raises one line naming both paths: the
finished results are never lost to a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path

from trace_gym.runs.files import atomic_write_text

#: What each kind of output is, for messages.
_KINDS = {"file": "a file", "folder": "a folder"}


def _existing_ancestor(path: Path) -> Path:
    """The nearest ancestor of ``path`` that exists (a link counts), ``.`` at worst."""
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(".")


def output_problem(path: str | Path, kind: str) -> str | None:
    """Why ``path`` cannot be written as ``kind`` (``"file"`` or ``"folder"``), as a predicate
    (``is a folder, not a file``, ``cannot be created: '/x/f' is a file``), else ``None``.
    Creates nothing."""
    if not str(path).strip():
        return "is empty"
    p = Path(path).expanduser()
    if p.exists():
        if kind == "file" and p.is_dir():
            return "is a folder, not a file"
        if kind == "folder" and not p.is_dir():
            return "is a file, not a folder"
        if not os.access(p, os.W_OK):
            return "is not writable"
        return None
    parent = _existing_ancestor(p)
    if not parent.is_dir():
        return f"cannot be created: {str(parent)!r} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created: folder {str(parent)!r} is not writable"
    return None


def check_output(path: str | Path, kind: str, *, key: str) -> None:
    """``ValueError`` (one line: ``KEY 'PATH' is a folder, not a file``) unless ``path`` can be
    written as ``kind``; call it when the command starts, before any work."""
    problem = output_problem(path, kind)
    if problem is not None:
        raise ValueError(f"{key} {str(path)!r} {problem}; give {_KINDS[kind]} path")


def check_config_outputs(cfg: object) -> None:
    """:func:`check_output` on every field of ``cfg`` declared an output (``doc(..., output=...)``),
    named by its key."""
    for f in dataclasses.fields(cfg):
        kind = f.metadata.get("output")
        if kind is not None:
            check_output(getattr(cfg, f.name), kind, key=f.name)


def _keep(path: Path, text: str) -> Path | None:
    """Write ``text`` to a new file named after ``path``: beside it, else in the working folder,
    else in the temp folder; ``None`` when none of them takes it."""
    name = f"{path.name or 'results'}.unsaved-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for folder in (_existing_ancestor(path), Path.cwd(), Path(tempfile.gettempdir())):
        try:
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            return folder / name
        except OSError:
            continue
    return None


def write_output_text(path: str | Path, text: str, *, key: str) -> Path:
    """Write ``text`` to the file ``path`` (its folders made, atomically); returns ``path``.

    Raises:
        ValueError: the write failed (the path changed since :func:`check_output`): one line
            naming ``key``, the path and the error, and where the text was kept instead.
    """
    p = Path(path).expanduser()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(p, text)
        return p
    except OSError as exc:
        kept = _keep(p, text)
        where = f"the results are in {kept} instead" if kept else "and no folder took a copy"
        raise ValueError(f"{key} {str(path)!r} could not be written ({type(exc).__name__}: "
                         f"{exc.strerror or exc}); {where}") from None


def write_failure(key: str, path: str | Path, exc: OSError) -> str:
    """The one line for outputs (plots) that failed after the results were kept."""
    return f"{key} {str(path)!r}: could not write into it ({type(exc).__name__}: {exc.strerror or exc})"
