"""The ``PYTHONPATH`` a child Python process gets so that it imports what this one does."""

from __future__ import annotations

import os
import sys


def source_folders_path() -> str:
    """This interpreter's source folders on ``sys.path`` (a test folder, a plugin checkout,
    the repo), as a ``PYTHONPATH`` value: not site-packages nor anything under the
    interpreter's prefixes, which the child finds itself. Forwarding those would put them
    ahead of its site-packages, and setuptools, once imported, appends its ``_vendor`` folder
    to ``sys.path``: a child given it imports setuptools' old ``typing_extensions``
    (pydantic then fails to import)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    keep: list[str] = []
    for entry in sys.path:
        real = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(real) or "site-packages" in real or any(real.startswith(p + os.sep) for p in prefixes):
            continue
        if real not in keep:
            keep.append(real)
    return os.pathsep.join(keep)
