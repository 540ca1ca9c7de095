"""Building a verifiers env and reading its dataset and messages as ours.

:func:`load_env` builds the process's one ``vf.Environment`` per (module, arguments),
keeping the host's signal handlers; :func:`tasks_of` and :func:`load_tasks` read the env's
dataset rows as :class:`~trace_gym.types.Task` (the row rides in ``metadata["row"]``);
:func:`_message` reads a verifiers message (pydantic or dict) as a
:class:`~trace_gym.types.Message`. verifiers is imported inside :func:`load_env` only.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping, Sequence

from trace_gym.env.adapter import content_text

from trace_gym.env.process_state import process_state_kept
from trace_gym.types import ROLES, Message, Task

SPLITS = ("train", "eval")

def module_name(name: str) -> str:
    """The module ``vf.load_environment`` imports for an env id (``owner/vf-x`` -> ``vf_x``)."""
    return name.replace("-", "_").split("/")[-1]


_ENVS: dict[str, Any] = {}
_ENVS_LOCK = threading.Lock()


def load_env(module: str, env_args: Mapping[str, Any] | None = None) -> Any:
    """The process's one ``vf.Environment`` of ``module`` built with ``env_args`` (cached).

    Building one registers SIGINT/SIGTERM handlers (verifiers' teardown); the process's own
    handlers are put back afterwards, so the host keeps its signal policy (teardown still
    runs at exit). That needs the main thread: make the first env of an id there.

    Raises:
        RuntimeError: first built off the main thread, or ``load_environment`` failed.
    """
    import signal

    args = dict(env_args or {})
    key = f"{module}?{json.dumps(args, sort_keys=True, default=repr)}"
    with _ENVS_LOCK:
        if key in _ENVS:
            return _ENVS[key]
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"verifiers:{module}: a verifiers Environment registers signal handlers when built, "
                               "which only the main thread may do; make the first env of this id on the main thread")
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            with process_state_kept():  # importing verifiers draws from the global random
                import verifiers as vf

                env = vf.load_environment(module, **args)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        _ENVS[key] = env
        return env


def _content(content: Any) -> str:
    """A verifiers message content as text (text parts joined by a space, as ``vf.Parser`` does)."""
    return content_text(content, sep=" ").strip()


def _field(message: Any, key: str) -> Any:
    return message.get(key) if isinstance(message, Mapping) else getattr(message, key, None)


def _message(raw: Any) -> Message:
    """A verifiers message (pydantic or dict) as a :class:`Message`; completion-style
    ``text`` messages read as user messages."""
    role = _field(raw, "role")
    role = "user" if role == "text" else role
    if role not in ROLES:
        raise ValueError(f"verifiers message role {role!r} is not one of {ROLES}")
    call_id = _field(raw, "tool_call_id")
    return Message(role, _content(_field(raw, "content")),
                   tool_call_id=call_id if role == "tool" and isinstance(call_id, str) else None)


def _prompt_text(messages: Sequence[Any]) -> str:
    users = [m for m in messages if _field(m, "role") == "user"]
    return _content(_field(users[-1], "content")) if users else ""


def _is_label(task: Any) -> bool:
    """A ``task`` column value that is a plain label (older envs), not a serialized task payload."""
    return isinstance(task, str) and bool(task) and not task.lstrip().startswith("{")


def tasks_of(env: Any, module: str, split: str = "train") -> list[Task]:
    """Every row of a verifiers env's dataset as a :class:`Task` (``train``: ``env.dataset``,
    ``eval``: ``env.eval_dataset``, each the other where the env has only one); the row (its
    ``prompt``, ``answer``, ``info``, ``task``, ``example_id``) rides in ``metadata["row"]``."""
    if split not in SPLITS:
        raise ValueError(f"verifiers:{module}: split must be one of {SPLITS}, got {split!r}")
    has_train = env.dataset is not None or getattr(env, "dataset_source", None) is not None
    # each split falls back to the other where the env has only one (verifiers' eval falls back likewise)
    dataset = env.get_dataset() if split == "train" and has_train else env.get_eval_dataset()
    tasks = []
    for row in dataset.to_list():
        label = row.get("task")
        tasks.append(Task(id=f"{module}/{split}/{row['example_id']}", prompt=_prompt_text(row.get("prompt") or []),
                          answer=row.get("answer"), source=label if _is_label(label) else module,
                          metadata={"row": row, "module": module, "split": split}))
    return tasks


def load_tasks(n: int, seed: int = 0, *, module: str, env_args: Mapping[str, Any] | None = None,
               split: str = "train") -> list[Task]:
    """``n`` distinct tasks of the env's dataset, drawn without replacement with a seeded permutation.

    Raises:
        ValueError: ``n`` outside ``[0, number of rows]``, or an unknown ``split``.
    """
    import numpy as np

    tasks = tasks_of(load_env(module, env_args), module, split)
    if not 0 <= n <= len(tasks):
        raise ValueError(f"n must be in [0, {len(tasks)}] for verifiers:{module} ({split}), got {n}")
    return [tasks[i] for i in np.random.default_rng(seed).permutation(len(tasks))[:n]]
