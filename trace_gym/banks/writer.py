"""Writing a bank: :class:`BankWriter` appends fsync'd lines and resumes a killed recording;
:func:`weights_hash` names the policy's weights for the manifest. The layout is in
:mod:`trace_gym.banks.format`."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from trace_gym.banks.format import (FORMAT, RUN_KEYS, VERSION, BankError, check_prompt_record, compress_line,
                                    encode_line, iter_members, parse_line, scan_bank)


def _normal(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class BankWriter:
    """Appends prompts to a bank, durably: each line is one gzip member, flushed and fsync'd.

    A new file gets the header first. With ``resume`` an existing file is scanned: a
    partial last member (a recorder killed mid-write) is cut off, the prompts already
    there are known (:attr:`present`) and the checksum continues from them; a manifest
    that differs from the file's (except :data:`RUN_KEYS`) is refused, naming the keys.

    Args:
        path: the bank file.
        manifest: the header's manifest (JSON-friendly).
        resume: continue an existing file instead of refusing to overwrite it.
    """

    def __init__(self, path: str | os.PathLike, manifest: Mapping[str, Any], *, resume: bool = False):
        self.path = Path(path)
        self.manifest = _normal(dict(manifest))
        self.present: set[str] = set()
        self.truncated_bytes = 0
        self.complete = False
        self._digest = hashlib.sha256()
        self._runs: list[dict[str, Any]] = []
        self._last_write: dict[int, float] = {}
        if self.path.exists():
            if not resume:
                raise BankError(f"{self.path} exists; pass resume=True to continue it, or choose another path")
            self._resume()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"kind": "header", "format": FORMAT, "version": VERSION, "manifest": self.manifest}
            self._append(encode_line(header))

    def _resume(self) -> None:
        scan = scan_bank(self.path, lenient=True)
        old = {k: v for k, v in scan.manifest.items() if k not in RUN_KEYS}
        new = {k: v for k, v in self.manifest.items() if k not in RUN_KEYS}
        differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        if differ:
            detail = "; ".join(f"{k}: file {old.get(k)!r}, now {new.get(k)!r}" for k in differ)
            raise BankError(f"{self.path} was recorded with other settings ({detail}); resume with the same "
                            "settings, or record into another file")
        if scan.partial_bytes:
            with open(self.path, "r+b") as f:
                f.truncate(scan.end)
                os.fsync(f.fileno())
            self.truncated_bytes = scan.partial_bytes
        self.manifest = scan.manifest
        self.complete = scan.footer is not None
        self._runs = scan.runs
        for e in scan.prompts:
            self.present.add(e.task_id)
        with open(self.path, "rb") as f:  # the checksum continues from the prompts already there
            for offset, stop, line in iter_members(f, self.path, lenient=True):
                obj = parse_line(line, self.path, offset) if stop is not None else {}
                if obj.get("kind") == "prompt":
                    self._digest.update(line)
                    self._last_write[int(obj.get("run", 0))] = float(obj.get("written_at", 0.0))

    def _append(self, line: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(compress_line(line))
            f.flush()
            os.fsync(f.fileno())

    def start_run(self, command: Sequence[str] | None = None) -> int:
        """Record that a run starts now; returns its index (0 for the first)."""
        if self.complete:
            raise BankError(f"{self.path} is complete; nothing to record")
        run = {"kind": "run", "run": len(self._runs), "command": list(command or []), "started_at": time.time()}
        self._append(encode_line(run))
        self._runs.append(run)
        return run["run"]

    def add(self, record: Mapping[str, Any]) -> None:
        """Append one prompt line (checked with :func:`check_prompt_record`; a prompt already in the
        bank is refused)."""
        if self.complete:
            raise BankError(f"{self.path} is complete; cannot add prompts")
        record = {"kind": "prompt", **record}
        check_prompt_record(record)
        task_id = record["task"]["id"]
        if task_id in self.present:
            raise BankError(f"{self.path} already holds prompt {task_id!r}")
        line = encode_line(record)
        self._append(line)
        self._digest.update(line)
        self.present.add(task_id)
        self._last_write[int(record.get("run", 0))] = float(record.get("written_at", time.time()))

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Append the footer (count, checksum, recording seconds summed over runs); returns it."""
        now = time.time()
        seconds = 0.0
        for n, run in enumerate(self._runs):
            last = now if n == len(self._runs) - 1 else self._last_write.get(n, run["started_at"])
            seconds += max(last - run["started_at"], 0.0)
        footer = {"kind": "footer", "prompts": len(self.present), "sha256": self._digest.hexdigest(),
                  "finished_at": now, "runs": len(self._runs), "seconds": seconds, **_normal(extra)}
        self._append(encode_line(footer))
        self.complete = True
        return footer


# ---------------------------------------------------------------------- the policy's weights
def weights_hash(folder: str | os.PathLike | None) -> str | None:
    """:func:`trace_gym.models.weights_hash` of the policy folder (the one definition, shared
    with the eval cache), or ``None`` without a folder or without weights files."""
    from trace_gym.models import weights_hash as sha256_of_weights

    if folder is None or not Path(folder).is_dir():
        return None
    try:
        return sha256_of_weights(folder)
    except ValueError:
        return None
