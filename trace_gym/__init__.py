"""trace_gym: agent environments with snapshot/restore and a TRACE training harness.

Importing the package registers the built-in Gymnasium ids (``trace_gym/...``); it
imports no heavy backend.

The package stands in wings, one folder per part (README.md, "Architecture"). The modules
that stood side by side before them moved; :data:`MOVED` names each one's home. Importing
an old path raises an ``ImportError`` that names the new one, and so does asking a wing
that used to be a module for one of that module's names (``from trace_gym.env import
AgentEnv``): no old path re-exports anything.
"""

from __future__ import annotations

from trace_gym.registry import register_envs as _register_envs
from trace_gym.utils.moved import MOVED, MOVED_PACKAGES, install_finder, moved_name, moved_to

__version__ = "0.1.0"

__all__ = ["MOVED", "MOVED_PACKAGES", "moved_name", "moved_to"]

install_finder()
_register_envs(plugins=False)
