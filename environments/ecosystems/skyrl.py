"""skyrl-gym (NovaSky's SkyRL) envs under the trace_gym contract: ``--env skyrl:<env_class>``.

A skyrl-gym env is built per sample, as SkyRL's generator builds it:
``skyrl_gym.make(env_class, env_config=..., extras=<the dataset row but prompt and env_class>)``,
then ``init(prompt) -> (messages, info)`` and ``step(action) -> BaseTextEnvStepOutput``.
:class:`SkyRLEnv` does exactly that at every ``reset``, from the sample a :class:`Task`
carries in its metadata (``prompt``, ``env_class``, ``extras``; :func:`load_tasks` reads
them from a SkyRL dataset file).

Ids: ``skyrl:<env_class>[?options]``, where ``env_class`` is any id in ``skyrl_gym``'s
registry: the built-ins (``gsm8k``, ``gsm8k_multi_turn``, ``aime``, ``text2sql``, ``search``,
``lcb``, ``searchcode``) or one a plugin module registered with
``skyrl_gym.register(id=..., entry_point="pkg.mod:Cls")``. Options (the query, or env / task
keyword arguments): ``path`` (the dataset: a parquet, jsonl or json file, or a list of
them; read by the task loader and by ``reset()`` without a task), ``env_config`` (the
``environment.skyrl_gym.<env_class>`` section of a SkyRL config, a mapping; in a query also
dotted, ``env_config.db_path=/data/sql``), ``max_turns``, ``snapshot`` (``copy`` or
``replay``), ``private_rng``.

## Action Space
``TextAction``: the model's raw text, handed to ``step`` unchanged.

## Observation Space
At reset, the messages ``init(prompt)`` returns (the sample's chat prompt; it must hold a
user message); after each step, the step's ``observations`` as :class:`Message` s with
their roles kept (often none: ``gsm8k`` ends at once, ``text2sql`` answers in a user message).

## Rewards
The step's own ``reward`` (skyrl's ``compute_score`` and friends), every turn.

## Episode End
Terminated when the env says ``done``; truncated after ``max_turns`` steps of ours (also
given to the env as ``extras["max_turns"]``, as SkyRL's generator does), or on a step whose
env raised (``info["env_error"]``).

## Snapshot
``copy`` (default): a pickled deep copy of the skyrl env object, whose state is plain Python;
a ``ToolGroup`` (its tool table holds lambdas, which do not pickle) is rebuilt from its
attributes. ``replay``: the sample and the actions, re-applied to a fresh env. With
``private_rng`` (default) the env draws from its own copy of the global ``random`` /
``numpy.random`` state, seeded from the episode seed (generators bound to the thread of each
call: no lock, steps of several envs run at once; a state copy per call), so turn it off
for I/O-bound envs (``search``) that use no global randomness. A step's ``done`` must be a
bool and its reward a number (a missing reward is 0.0): anything else, like an exception
or no reply within ``call_timeout_s``, is an error turn (the adapter's boundary,
:class:`~trace_gym.env.boundary.ForeignBoundary`).

Not carried over: the services some envs call (``text2sql`` needs its databases under
``env_config.db_path``; ``search``/``searchcode`` a retrieval server at
``env_config.search_url``), SkyRL's generator features (retokenised chat history,
``postprocessed_action`` replacing the model's text: we keep the raw action and put it in
``info``; ``get_metrics``), and the order of ``text2sql``'s result rows across processes
(a frozenset, whose order of strings follows ``PYTHONHASHSEED``).

## Version History
v0: first version (skyrl-gym 0.4.0).
"""

from __future__ import annotations

import copy
import functools
import importlib
import io
import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from trace_gym.env.adapter import ForeignEnv, content_text, options_of

from trace_gym.env.process_state import process_state_kept
from trace_gym.types import ROLES, Message, Task

PACKAGE = "skyrl-gym"
PREFIX = "skyrl"
ENTRY_POINT = "environments.ecosystems.skyrl:SkyRLEnv"
#: keyword arguments of :class:`SkyRLEnv` an id may set (``env_class``/``entry_point`` come from the name)
ENV_OPTIONS = ("path", "env_config", "max_turns", "snapshot", "private_rng", "call_timeout_s", "max_observation_chars")
#: keyword arguments of :func:`load_tasks` an id may set
LOADER_OPTIONS = ("path",)
#: the columns of a SkyRL dataset row that are not its ``extras``
PROMPT_KEY, ENV_CLASS_KEY = "prompt", "env_class"
_REGISTER_LOCK = threading.Lock()


# --- tasks --------------------------------------------------------------------------------


def _read_rows(path: str) -> list[dict]:
    """The rows of one dataset file: parquet (pyarrow, else pandas), jsonl, or a json list."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"skyrl dataset {path!r} is not a file")
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            import pandas

            return json.loads(pandas.read_parquet(file).to_json(orient="records"))
        return pq.read_table(file).to_pylist()
    text = file.read_text(encoding="utf-8")
    if suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(f"skyrl dataset {path!r}: a .json file must hold a list of rows")
        return rows
    raise ValueError(f"skyrl dataset {path!r}: expected a .parquet, .jsonl or .json file")


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
    return _content(users[-1].get("content")) if users else ""


def read_tasks(path: str | Sequence[str], env_class: str | None = None) -> list[Task]:
    """Every row of a SkyRL dataset (one file or several) as a :class:`Task`.

    A row has ``prompt`` (chat messages), ``env_class`` and any other columns (SkyRL hands
    those to the env as ``extras``: ``reward_spec``, ``extra_info``, ``data_source``...).
    With ``env_class``, rows naming another env class are left out (a row without one
    runs on ``env_class``, as SkyRL's ``environment.env_class`` default has it).

    Raises:
        ValueError: no such file, a row without a ``prompt`` list, or no row for ``env_class``.
    """
    paths = [str(p) for p in ([path] if isinstance(path, (str, os.PathLike)) else path)]
    tasks: list[Task] = []
    found: set[str] = set()
    for file in paths:
        for index, row in enumerate(_read_rows(file)):
            prompt = row.get(PROMPT_KEY)
            if not isinstance(prompt, list):
                raise ValueError(f"skyrl dataset {file!r} row {index}: 'prompt' must be a list of chat messages, "
                                 f"got {type(prompt).__name__}")
            row_class = row.get(ENV_CLASS_KEY) or env_class
            found.add(str(row_class))
            if env_class is not None and row_class != env_class:
                continue
            extras = {k: v for k, v in row.items() if k not in (PROMPT_KEY, ENV_CLASS_KEY)}
            reward_spec = extras.get("reward_spec")
            answer = reward_spec.get("ground_truth") if isinstance(reward_spec, Mapping) else None
            tasks.append(Task(id=f"{Path(file).stem}/{index}", prompt=_prompt_text(prompt), answer=answer,
                              source=str(extras.get("data_source") or f"{PREFIX}:{row_class}"),
                              metadata={"prompt": prompt, "env_class": row_class, "extras": extras}))
    if not tasks:
        raise ValueError(f"skyrl dataset {paths}: no row for env_class {env_class!r} (its rows name {sorted(found)})")
    return tasks


def load_tasks(n: int, seed: int = 0, *, path: str | Sequence[str] | None = None,
               env_class: str | None = None) -> list[Task]:
    """``n`` distinct tasks of a SkyRL dataset (:func:`read_tasks`), drawn without
    replacement with a seeded permutation.

    Raises:
        ValueError: no ``path``, or ``n`` outside ``[0, number of rows]``.
    """
    import numpy as np

    if path is None:
        where = f"{PREFIX}:{env_class}" if env_class else PREFIX
        raise ValueError(f"{where} needs a dataset: give path=FILE (a SkyRL parquet/jsonl with prompt, env_class, "
                         f"reward_spec, extra_info), e.g. --env '{where}?path=/data/train.parquet'")
    tasks = read_tasks(path, env_class)
    if not 0 <= n <= len(tasks):
        raise ValueError(f"n must be in [0, {len(tasks)}] for skyrl dataset {path}, got {n}")
    return [tasks[i] for i in np.random.default_rng(seed).permutation(len(tasks))[:n]]


# --- the adapter ------------------------------------------------------------------------------


def _content(content: Any) -> str:
    """A message's text: a string as is, the text parts of a content list joined (as SkyRL does)."""
    return content_text(content, sep="")


def _messages(raw: Any, what: str) -> list[Message]:
    """A skyrl conversation (a list of message dicts) as :class:`Message` s; anything else,
    a generator included (it could run without end before any bound applies), is refused."""
    if not isinstance(raw, (list, tuple)):
        raise TypeError(f"skyrl {what} must be a list of {{'role', 'content'}} dicts, got {type(raw).__name__}")
    return [_message(m) for m in raw]


def _message(raw: Any) -> Message:
    """One skyrl ``{"role", "content"}`` dict as a :class:`Message` (role kept)."""
    if not isinstance(raw, Mapping):
        raise TypeError(f"a skyrl observation must be a {{'role', 'content'}} dict, got {raw!r:.100}")
    role = raw.get("role")
    if role not in ROLES:
        raise ValueError(f"skyrl message role {role!r} is not one of {ROLES}")
    name, call_id = raw.get("name"), raw.get("tool_call_id")
    return Message(role, _content(raw.get("content")), name if isinstance(name, str) else None,
                   call_id if isinstance(call_id, str) else None)


def _rebuild_tool_group(cls: type, state: dict) -> Any:
    group = cls.__new__(cls)
    group.__dict__.update(state)
    group._tool_registry = {}
    group._register_tools()  # the bound tools, as ToolGroup.__init__ makes them
    return group


class _EnvPickler(pickle.Pickler):
    """Pickles a skyrl env; a ``ToolGroup`` travels as its attributes without the tool table."""

    def reducer_override(self, obj: Any) -> Any:
        from skyrl_gym.tools.core import ToolGroup

        if isinstance(obj, ToolGroup) and not isinstance(obj, type):
            return _rebuild_tool_group, (type(obj), {k: v for k, v in vars(obj).items() if k != "_tool_registry"})
        return NotImplemented


def _env_bytes(env: Any) -> bytes:
    buffer = io.BytesIO()
    _EnvPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(env)
    return buffer.getvalue()


class SkyRLEpisode:
    """Episodes of one skyrl-gym env class (a :class:`~trace_gym.env.adapter.ForeignEpisode`):
    a fresh env per sample, as SkyRL's generator builds it; its state, the env object, is
    plain Python (``copy``, pickled with ``ToolGroup`` s rebuilt). Arguments as
    :class:`SkyRLEnv`'s (``max_turns`` goes to the env as ``extras["max_turns"]``).

    Raises:
        ValueError: ``env_config`` that is not a mapping.
    """

    snapshot_strategies = ("copy", "replay")

    def __init__(self, env_class: str, *, entry_point: str | None = None, path: str | Sequence[str] | None = None,
                 env_config: Mapping[str, Any] | None = None, max_turns: int | None = None,
                 private_rng: bool = True):
        if env_config is not None and not isinstance(env_config, Mapping):
            raise ValueError(f"skyrl:{env_class}: env_config must be a mapping, got {env_config!r:.100}")
        self.env_class, self.entry_point, self.path = env_class, entry_point, path
        self.env_config = dict(env_config or {})
        self.max_turns = max_turns
        self.global_rng = bool(private_rng)  # per instance: the env reads it at every call
        self._pool: list[Task] | None = None
        self.env: Any = None  # the skyrl env of the current episode

    @property
    def env_key(self) -> str:
        return f"{PREFIX}:{self.env_class}"

    def default_tasks(self) -> Sequence[Task]:
        if self.path is None:
            return ()
        if self._pool is None:
            self._pool = read_tasks(self.path, self.env_class)
        return self._pool

    def load_task(self, task_id: str) -> Task:
        raise ValueError(f"{self.env_key} cannot load a task by id ({task_id!r}); pass the Task")

    def _spec(self) -> Any:
        import skyrl_gym

        with _REGISTER_LOCK:  # skyrl's register refuses an id twice; envs may begin on several threads
            if self.env_class not in skyrl_gym.registry and self.entry_point:
                with process_state_kept():  # it may register itself (and draw or log on import)
                    importlib.import_module(self.entry_point.partition(":")[0])
                if self.env_class not in skyrl_gym.registry:
                    skyrl_gym.register(id=self.env_class, entry_point=self.entry_point)
        return skyrl_gym.spec(self.env_class)

    def begin(self, task: Task, seed: int):
        import skyrl_gym
        from omegaconf import OmegaConf

        meta = task.metadata
        row_class = meta.get("env_class") or self.env_class
        if row_class != self.env_class:
            raise ValueError(f"task {task.id!r} is for skyrl env_class {row_class!r}, this env runs {self.env_class!r}")
        prompt = meta.get("prompt")
        if prompt is None:  # a Task written by hand: its prompt as the one user message
            prompt = [{"role": "user", "content": task.prompt}]
        extras = copy.deepcopy(dict(meta.get("extras") or {}))
        if "reward_spec" not in extras and task.answer is not None:
            extras["reward_spec"] = {"ground_truth": task.answer}
        extras.setdefault("extra_info", {})
        if self.max_turns is not None:
            extras["max_turns"] = self.max_turns  # as SkyRL's generator sets it
        self.env = skyrl_gym.make(self._spec(), env_config=OmegaConf.create(self.env_config), extras=extras)
        messages, info = self.env.init(copy.deepcopy(list(prompt)))
        return _messages(messages, "init's messages"), dict(info or {})

    def act(self, action: str):
        out = self.env.step(action)
        info: dict[str, Any] = {"metadata": dict(out.get("metadata") or {})}
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        obs = _messages(out.get("observations") or [], "step observations")
        reward = out.get("reward")  # it and done as the env gave them: the boundary checks them
        return obs, 0.0 if reward is None else reward, out.get("done"), False, info

    def state(self) -> bytes:
        return _env_bytes(self.env)

    def set_state(self, state: bytes) -> None:
        self.end()
        self.env = pickle.loads(state)

    def end(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            env.close()


class SkyRLEnv(ForeignEnv):
    """A skyrl-gym env class under our contract (see the module docstring): a
    :class:`~trace_gym.env.adapter.ForeignEnv` around a :class:`SkyRLEpisode`.

    Args:
        env_class: the skyrl-gym registry id.
        entry_point: ``"pkg.mod:Cls"`` to register ``env_class`` with where this process has
            not (a worker that never imported the user's plugin); its module is imported
            first, so a module that registers itself on import does so.
        path: the dataset ``reset()`` without a task draws from.
        env_config: the env's config section (made an OmegaConf ``DictConfig``, as SkyRL hands it).
        max_turns: truncate after this many steps; also ``extras["max_turns"]``.
        snapshot: ``copy`` (default) or ``replay``.
        private_rng: give the env its own global-RNG state (see the module docstring).
        call_timeout_s, max_observation_chars: the boundary's deadline per call into the
            env (seconds) and bound on an observation (characters); see
            :class:`~trace_gym.env.boundary.ForeignBoundary`.
    """

    def __init__(self, env_class: str, *, entry_point: str | None = None, path: str | Sequence[str] | None = None,
                 env_config: Mapping[str, Any] | None = None, max_turns: int | None = None,
                 snapshot: str | None = None, private_rng: bool = True, call_timeout_s: float | None = None,
                 max_observation_chars: int | None = None):
        episode = SkyRLEpisode(env_class, entry_point=entry_point, path=path, env_config=env_config,
                               max_turns=max_turns, private_rng=private_rng)
        super().__init__(episode, snapshot=snapshot, max_turns=max_turns, call_timeout_s=call_timeout_s,
                         max_observation_chars=max_observation_chars)


# --- the face ---------------------------------------------------------------------------------


def _entry_point_of(spec: Any) -> str | None:
    """A ``"module:attr"`` a fresh process can register ``spec`` with."""
    target = spec.entry_point
    if isinstance(target, str):
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    return f"{module}:{qualname}" if module and "<" not in qualname else None


def _env_options(where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """Env options with dotted ``env_config.KEY`` entries folded into ``env_config``."""
    out: dict[str, Any] = {}
    config: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("env_config."):
            config[key.removeprefix("env_config.")] = value
        else:
            out[key] = value
    options_of(out, ENV_OPTIONS, where)
    if config:
        base = out.get("env_config") or {}
        if not isinstance(base, Mapping):
            raise ValueError(f"{where}: env_config must be a mapping, got {base!r:.100}")
        out["env_config"] = {**base, **config}
    return out


def family(name: str, options: dict, env_kwargs: dict, task_kwargs: dict):
    """The :class:`~trace_gym.env.family.EnvFamily` of ``skyrl:<name>?<options>``.

    Raises:
        ValueError: ``name`` not in skyrl-gym's registry, or an option it does not take
            (one line each, with did-you-mean).
    """
    with process_state_kept():
        import skyrl_gym

    from trace_gym.utils.suggest import did_you_mean
    from trace_gym.env.family import adapter_family

    where = f"--env {PREFIX}:{name}"
    if name not in skyrl_gym.registry:
        known = sorted(skyrl_gym.registry)
        raise ValueError(f"{where}: not a registered skyrl-gym env class{did_you_mean(name, known)}; registered: "
                         f"{known} (a plugin module registers its own with skyrl_gym.register(id=..., "
                         "entry_point='pkg.mod:Cls'); load it with --plugin MODULE)")
    loader_kwargs = {k: options[k] for k in LOADER_OPTIONS if k in options}
    env_options = _env_options(where, {k: v for k, v in options.items() if k not in LOADER_OPTIONS})
    env_options |= _env_options(f"{where} env kwargs", env_kwargs)
    options_of(task_kwargs, LOADER_OPTIONS, f"{where} task kwargs")
    loader_kwargs |= task_kwargs
    if "path" in loader_kwargs:
        env_options.setdefault("path", loader_kwargs["path"])
    elif "path" in env_options:
        loader_kwargs["path"] = env_options["path"]
    kwargs = {"env_class": name, "entry_point": _entry_point_of(skyrl_gym.spec(name)), **env_options}
    return adapter_family(PREFIX, name, ENTRY_POINT, env_kwargs=kwargs,
                          task_loader=functools.partial(load_tasks, env_class=name), loader_kwargs=loader_kwargs,
                          description=f"skyrl-gym {name} (per-sample env; dataset from path=)")


def available() -> list[str]:
    """Every env class in skyrl-gym's registry (the built-ins and those plugins registered)."""
    with process_state_kept():
        import skyrl_gym

    return [f"{PREFIX}:{name}" for name in sorted(skyrl_gym.registry)]
