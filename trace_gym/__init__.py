"""trace_gym: agent environments with snapshot/restore and a TRACE training harness.

Importing the package registers the built-in Gymnasium ids (``trace_gym/...``); it
imports no heavy backend.
"""

from trace_gym.registry import register_envs as _register_envs

__version__ = "0.1.0"

_register_envs(plugins=False)
