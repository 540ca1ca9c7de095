"""Prime Intellect's ``verifiers`` envs under the trace_gym contract: ``--env verifiers:<module>``.

A verifiers env (the classic API: ``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``)
runs its own rollout loop against a model client. :class:`VerifiersEnv` inverts control
without rewriting that loop: each episode runs the env's own ``run_rollout`` coroutine (its
``setup_state``, ``env_response``, ``@vf.stop`` conditions, timeouts, rubric scoring and
cleanup, unchanged) on a private event-loop thread, with a ``vf.Client`` whose "model" is
us: every model call hands its prompt to ``step``'s caller and waits for the next action.
All episodes of a process share that one loop and one ``Environment`` per id, as a
verifiers evaluation does, so an async rubric (a judge call, a sleep) of one episode never
holds up another episode stepping from another thread (blocking synchronous code in an env
holds up the loop, as it would in verifiers). Building an ``Environment`` registers signal
handlers, so the first env of an id is made on the main thread; the host's own SIGINT and
SIGTERM handlers are put back after it (verifiers' teardown still runs at exit).

Ids: ``verifiers:<module>[?k=v&...]``: ``module`` is an importable module with
``load_environment(**kwargs)`` (an Environments Hub package: ``vf-gsm8k`` and
``owner/vf-gsm8k`` name the module ``vf_gsm8k``, as ``vf.load_environment`` reads them), and
the query's keyword arguments go to ``load_environment``. The adapter's own options are env
keyword arguments (``max_turns``, ``split``, ``step_timeout``, ``tool_calls``); the task
loader takes ``split`` (``train``: ``env.dataset``; ``eval``: ``env.eval_dataset``; each the
other where the env has only one). A row goes to ``run_rollout`` as the dataset holds it,
except a plain-string ``task`` column (older envs' label, kept as ``Task.source``), which
verifiers 0.1.14 would read as a serialized task payload and refuse.

## Action Space
``TextAction``: the model's raw text, the content of the assistant message verifiers
records. With ``tool_calls="hermes"`` (default) and an env that offers tools,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks also become the
message's tool calls (a block that is not such JSON stays text, as vLLM's hermes parser has it).

## Observation Space
At reset, the rollout's first prompt (system prompt, few-shot and question); after each
step, the messages the env appended before asking the model again (its ``env_response``:
user or tool messages, roles kept), and at the end any ``final_env_response``. An env
that rewrites earlier messages (an overridden ``get_prompt_messages``) gets its whole new
prompt as the observation, with ``info["prompt_rewritten"] = True``. The env's tool schemas
are in the reset info (``info["tool_defs"]``); they are not rendered into a message.

## Rewards
0.0 until the step that ends the rollout, which carries the env's rubric score: the
rubric's ``score_rollout`` (awaited), the weighted sum sum_i w_i * f_i of its reward
functions (weights default 1.0; ``add_metric`` functions weigh 0; a ``RubricGroup``, such as
the one ``MultiTurnEnv`` adds its turn-count metric with, sums its rubrics). The per-function
values are in ``info["metrics"]``. Rubrics with group-level reward functions are refused:
trace_gym scores each episode alone.

## Episode End
Terminated when one of the env's stop conditions ends the rollout (its ``max_turns``
included: verifiers scores that end like any other). Truncated after ``max_turns`` steps
of ours (the env's reply to the last action is still observed and the rollout scored, the
stop verifiers records as an overlong prompt), on a timeout, an overlong prompt, an error
the env recorded (``info["env_error"]``), or a step whose env raised. ``info`` of the last
step has ``stop_condition`` (the name of the stop that fired) and ``metrics``. A rollout
that ends before the model speaks (``setup_state`` failed) shows its prompt at reset with
``info["env_error"]``, and its first step ends it.

## Snapshot
``replay`` only: a suspended coroutine cannot be copied and the state holds the client, so a
snapshot is the task and the actions, replayed through a fresh rollout (digest-checked).
An env that draws from unseeded randomness in ``env_response`` is refused under replay
(:class:`~trace_gym.env_adapter.ReplayDivergence`).

Not carried over: the env's sampling args and ``max_seq_len`` (there is no model client;
the agent loop samples), tool schemas as a prompt (they are in ``info["tool_defs"]``), group
scoring (``score_group``, per-step trajectory rewards), and the non-classic envs that run
agents in sandboxes or behind interception servers.

## Version History
v0: first version (verifiers 0.1.14, classic API).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import importlib.util
import inspect
import json
import os
import queue
import re
import threading
from typing import Any, Mapping, Sequence

from trace_gym.env_adapter import MAX_ERROR_CHARS, AdaptedEnv, content_text, error_text, options_of, process_state_kept
from trace_gym.textsafe import JSONRefused, loads_bounded
from trace_gym.types import ROLES, Message, Task

PACKAGE = "verifiers"
PREFIX = "verifiers"
ENTRY_POINT = "environments.ecosystems.verifiers:VerifiersEnv"
#: the adapter's own keyword arguments (env kwargs); the id's query goes to load_environment
ENV_OPTIONS = ("max_turns", "snapshot", "split", "step_timeout", "tool_calls")
LOADER_OPTIONS = ("split",)
SPLITS = ("train", "eval")
TOOL_CALL_FORMATS = ("hermes", "none")
#: stop conditions that end a rollout short of the task (truncated rather than terminated)
TRUNCATING_STOPS = ("has_error", "prompt_too_long", "timeout_reached", "max_total_completion_tokens_reached")
#: the model name the env's rollout records
MODEL_NAME = "trace_gym"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


# --- loading envs -------------------------------------------------------------------------------


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


# --- the event loop and the client that hands actions in ----------------------------------------

_LOOP: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's private loop, run forever on a daemon thread (a fresh one after a fork)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP[0] != os.getpid() or not _LOOP[2].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="trace_gym-verifiers-loop", daemon=True)
            thread.start()
            _LOOP = (os.getpid(), loop, thread)
        return _LOOP[1]


class _Handover:
    """One rollout's meeting point: the env's loop posts events (``("prompt", messages,
    tools)``, ``("done", output)``, ``("error", exc)``) to :attr:`events`; the adapter answers
    a prompt by resolving :attr:`pending` with the action."""

    def __init__(self, limit: int | None, tool_calls: str):
        self.events: queue.Queue = queue.Queue()
        self.pending: asyncio.Future | None = None
        self.turns = 0
        self.limit, self.tool_calls = limit, tool_calls
        self.limit_prompt: list | None = None  # the prompt the model was refused at our max_turns


def hermes_tool_calls(text: str, turn: int) -> list[dict[str, str]]:
    """``<tool_call>{"name", "arguments"}</tool_call>`` blocks of ``text`` as verifiers tool
    calls (``{"id", "name", "arguments": json}``); blocks that are not such JSON are skipped.
    One left-to-right scan (an unclosed tag ends it), so hostile text stays linear."""
    calls: list[dict[str, str]] = []
    start = text.find(_OPEN)
    while start >= 0:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        try:  # bounded before parsing: deep nesting or a 5,000-digit number must not raise
            body = loads_bounded(text[start + len(_OPEN):end])
        except JSONRefused:
            body = None
        if isinstance(body, dict) and isinstance(body.get("name"), str):
            arguments = body.get("arguments", body.get("parameters", {}))
            calls.append({"id": f"call_{turn}_{len(calls)}", "name": body["name"],
                          "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
        start = text.find(_OPEN, end + len(_CLOSE))
    return calls


@functools.cache
def _client_class() -> type:
    """The ``vf.Client`` whose responses are our actions (made on first use: verifiers is heavy)."""
    import time

    with process_state_kept():
        import verifiers as vf
        from verifiers.clients import Client
        from verifiers.types import Response, ResponseMessage, ToolCall

    class ActionClient(Client):
        """A model client for one rollout: ``get_response`` posts the prompt and waits for the action."""

        def setup_client(self, config: Any) -> Any:
            raise TypeError("ActionClient is built on a hand-over, not a ClientConfig")

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return list(messages), {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None,
                                      **kwargs: Any) -> tuple[str, list]:
            handover: _Handover = self.client
            if handover.limit is not None and handover.turns >= handover.limit:
                handover.limit_prompt = list(prompt)
                raise vf.OverlongPromptError(f"trace_gym max_turns={handover.limit} reached")
            action = asyncio.get_running_loop().create_future()
            handover.pending = action
            handover.events.put(("prompt", list(prompt), tools))
            text = await action
            handover.turns += 1
            calls = hermes_tool_calls(text, handover.turns) if tools and handover.tool_calls == "hermes" else []
            return text, calls

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: tuple[str, list]) -> Any:
            text, calls = response
            message = ResponseMessage(content=text, finish_reason="tool_calls" if calls else "stop",
                                      is_truncated=False, tool_calls=[ToolCall(**c) for c in calls] or None)
            return Response(id=f"trace_gym-{time.monotonic_ns()}", created=int(time.time()), model=MODEL_NAME,
                            usage=None, message=message)

        async def close(self) -> None:
            return None

    return ActionClient


async def _drive(env: Any, row: dict, client: Any, sampling_args: dict, events: queue.Queue) -> None:
    """Run one rollout through the env's public ``run_rollout`` (rollout, scoring, cleanup)."""
    try:
        output = await env.run_rollout(row, client, MODEL_NAME, sampling_args)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001  (the env's own failure: the adapter reports it on the step)
        events.put(("error", exc))
    else:
        events.put(("done", output))


def _output_error(output: Mapping[str, Any]) -> str | None:
    """The error a rollout output records (verifiers' ``ErrorInfo``), as one string."""
    error = output.get("error")
    if not error:
        return None
    text = error.get("error_chain_repr") or error.get("error") if isinstance(error, Mapping) else error
    return str(text)[:MAX_ERROR_CHARS]


def _deliver(future: asyncio.Future | None, action: str) -> None:
    if future is not None and not future.done():  # a timed-out rollout cancelled it already
        future.set_result(action)


# --- the adapter ---------------------------------------------------------------------------------


class VerifiersEnv(AdaptedEnv):
    """A verifiers env module under our contract (see the module docstring).

    Args:
        module: the module with ``load_environment``.
        env_args: its keyword arguments.
        split: the dataset ``reset()`` without a task draws from (``train`` or ``eval``).
        max_turns: truncate after this many steps (the rollout is still scored).
        snapshot: ``replay`` (the only strategy).
        step_timeout: seconds a step waits for the env's next turn before it fails (truncated).
        tool_calls: ``hermes`` (read ``<tool_call>`` blocks of envs with tools) or ``none``.
    """

    snapshot_strategies = ("replay",)

    def __init__(self, module: str, *, env_args: Mapping[str, Any] | None = None, split: str = "train",
                 max_turns: int | None = None, snapshot: str | None = None, step_timeout: float = 600.0,
                 tool_calls: str = "hermes"):
        super().__init__(snapshot=snapshot, max_turns=max_turns)
        if split not in SPLITS:
            raise ValueError(f"verifiers:{module}: split must be one of {SPLITS}, got {split!r}")
        if tool_calls not in TOOL_CALL_FORMATS:
            raise ValueError(f"verifiers:{module}: tool_calls must be one of {TOOL_CALL_FORMATS}, got {tool_calls!r}")
        if not (isinstance(step_timeout, (int, float)) and step_timeout > 0):
            raise ValueError(f"verifiers:{module}: step_timeout must be positive seconds, got {step_timeout!r}")
        self.module, self.env_args, self.split = module, dict(env_args or {}), split
        self.step_timeout, self.tool_calls = float(step_timeout), tool_calls
        self.vf_env = load_env(module, self.env_args)
        if self.vf_env.rubric.has_group_rewards:
            raise ValueError(f"verifiers:{module}: its rubric has group-level reward functions (scored over a group "
                             "of rollouts together); trace_gym scores each episode alone")
        self._pool: list[Task] | None = None
        self._handover: _Handover | None = None
        self._run: Any = None  # the concurrent.futures.Future of the rollout
        self._seen: list[tuple[str, str]] = []  # (role, content) of the conversation so far
        self._early_end: tuple | None = None  # a rollout that ended before the model spoke

    @property
    def env_key(self) -> str:
        return f"{PREFIX}:{self.module}"

    def _default_tasks(self) -> Sequence[Task]:
        if self._pool is None:
            self._pool = tasks_of(self.vf_env, self.module, self.split)
        return self._pool

    def _next_event(self) -> tuple:
        try:
            return self._handover.events.get(timeout=self.step_timeout)
        except queue.Empty:
            raise TimeoutError(f"verifiers:{self.module} gave no next turn within {self.step_timeout:g} s") from None

    def _begin(self, task: Task, seed: int):
        row = dict(task.metadata.get("row") or {})
        if not row:  # a Task written by hand: its prompt as the one user message
            row = {"prompt": [{"role": "user", "content": task.prompt}], "answer": task.answer or "",
                   "example_id": 0, "info": {}}
        if _is_label(row.get("task")):
            del row["task"]  # an older env's label (kept as Task.source); verifiers now reads a task payload there
        self._handover, self._seen = _Handover(self.max_turns, self.tool_calls), []
        client = _client_class()(self._handover)
        sampling_args = copy.deepcopy(self.vf_env.sampling_args)  # the env's own; our client ignores them
        self._run = asyncio.run_coroutine_threadsafe(
            _drive(self.vf_env, copy.deepcopy(row), client, sampling_args, self._handover.events), event_loop())
        event = self._next_event()
        if event[0] != "prompt":  # ended (or failed) before the first model call
            self._early_end = event
            prompt = [_message(m) for m in row.get("prompt") or []]
            self._seen = [(m.role, m.content) for m in prompt]
            detail = _output_error(event[1]) if event[0] == "done" else error_text(event[1])
            return prompt, ({"env_error": detail} if detail else {})
        self._early_end = None
        obs, info = self._observe(event[1])
        tools = event[2]
        if tools:
            info["tool_defs"] = [t.model_dump() if hasattr(t, "model_dump") else dict(t) for t in tools]
        return obs, info

    def _observe(self, messages: Sequence[Any]) -> tuple[list[Message], dict[str, Any]]:
        """The messages after the conversation so far (all of them, if the env rewrote it)."""
        converted = [_message(m) for m in messages]
        pairs = [(m.role, m.content) for m in converted]
        info: dict[str, Any] = {}
        if pairs[: len(self._seen)] == self._seen:
            new = converted[len(self._seen):]
        else:
            new, info["prompt_rewritten"] = converted, True
        self._seen = pairs
        return new, info

    def _act(self, action: str):
        if self._early_end is not None:
            return self._finish(self._early_end)
        pending, self._handover.pending = self._handover.pending, None
        event_loop().call_soon_threadsafe(_deliver, pending, action)
        self._seen.append(("assistant", action))
        event = self._next_event()
        if event[0] == "prompt":
            obs, info = self._observe(event[1])
            return obs, 0.0, False, False, info
        return self._finish(event)

    def _finish(self, event: tuple):
        """The step that ends the rollout: the env's last messages, its rubric's reward."""
        kind, payload = event[0], event[1]
        if kind == "error":
            raise payload
        output = payload
        hit_limit = self._handover.limit_prompt is not None
        if hit_limit:  # the env answered our last action before the model was refused
            obs, info = self._observe(self._handover.limit_prompt)
        else:
            obs, info = self._observe(self._conversation(output))
        stop, error = output.get("stop_condition"), output.get("error")
        info |= {"stop_condition": stop, "metrics": dict(output.get("metrics") or {})}
        if error:
            info["env_error"] = _output_error(output)
        truncated = bool(hit_limit or error or stop in TRUNCATING_STOPS or output.get("is_truncated"))
        return obs, float(output.get("reward") or 0.0), not truncated, truncated, info

    @staticmethod
    def _conversation(output: Mapping[str, Any]) -> list:
        return [*(output.get("prompt") or []), *(output.get("completion") or [])]

    def _end(self) -> None:
        if self._run is not None and not self._run.done():
            self._run.cancel()  # the rollout's own finally (cleanup handlers) runs on the loop
        self._run = None
        self._handover, self._early_end = None, None


# --- the face --------------------------------------------------------------------------------------


def _near_modules(module: str) -> list[str]:
    """Names ``module`` may have meant: the installed env modules, and the siblings of a
    dotted name inside its (importable) package."""
    names = [name.removeprefix(f"{PREFIX}:") for name in available()]
    package, dot, _ = module.rpartition(".")
    if dot:
        try:
            with process_state_kept():
                parent = importlib.import_module(package)
        except ImportError:
            return names
        import pkgutil

        names += [f"{package}.{info.name}" for info in pkgutil.iter_modules(getattr(parent, "__path__", []))]
    return names


def _find_spec(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None


def _load_function(module: str, where: str) -> Any:
    if _find_spec(module) is None:
        from trace_gym.config import did_you_mean

        names = _near_modules(module)
        raise ValueError(f"{where}: no importable module {module!r}{did_you_mean(module, names)}; install an "
                         "Environments Hub package (prime env install OWNER/NAME) or put the module on sys.path")
    try:
        with process_state_kept():  # the env module imports verifiers
            imported = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (the env package's own import failure, in one line)
        raise ValueError(f"{where}: importing module {module!r} failed: {error_text(exc)}") from exc
    load = getattr(imported, "load_environment", None)
    if not callable(load):
        raise ValueError(f"{where}: module {module!r} has no load_environment(**kwargs)")
    return load


def _check_env_args(load: Any, env_args: Mapping[str, Any], where: str) -> None:
    params = inspect.signature(load).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    options_of(env_args, [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)],
               f"{where} (load_environment)")


def family(name: str, options: dict, env_kwargs: dict, task_kwargs: dict):
    """The :class:`~trace_gym.registry.EnvFamily` of ``verifiers:<name>?<load_environment kwargs>``.

    Raises:
        ValueError: no such module, no ``load_environment``, or a keyword argument it (or the
            adapter, or the task loader) does not take: one line each, with did-you-mean.
    """
    from trace_gym.registry import adapter_family

    where = f"--env {PREFIX}:{name}"
    module = module_name(name)
    _check_env_args(_load_function(module, where), options, where)
    options_of(env_kwargs, ENV_OPTIONS, f"{where} env kwargs")
    options_of(task_kwargs, LOADER_OPTIONS, f"{where} task kwargs")
    split = task_kwargs.get("split", env_kwargs.get("split", "train"))
    kwargs = {"module": module, "env_args": dict(options), **env_kwargs}
    return adapter_family(PREFIX, name, ENTRY_POINT, env_kwargs=kwargs,
                          task_loader=functools.partial(load_tasks, module=module, env_args=dict(options)),
                          loader_kwargs={"split": split},
                          description=f"verifiers env {module} (rollout driven turn by turn; replay snapshots)")


def _defines_load_environment(module: str) -> bool:
    """Whether ``module``'s source (found without importing it) names ``load_environment``."""
    spec = _find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(spec.origin, encoding="utf-8") as file:
            return "load_environment" in file.read()
    except OSError:
        return False


def available() -> list[str]:
    """The installed env modules: top-level modules of distributions that require
    ``verifiers`` and whose source defines ``load_environment`` (Environments Hub packages).
    Found without importing them; may be empty (then name any importable module)."""
    from importlib import metadata

    found: set[str] = set()
    for dist in metadata.distributions():
        if not any(re.match(r"verifiers\b(?![-_.\w])", req) for req in dist.requires or []):
            continue
        tops = (dist.read_text("top_level.txt") or "").split()
        if not tops:
            tops = sorted({str(f).split("/")[0].removesuffix(".py") for f in dist.files or []
                           if not str(f).split("/")[0].endswith((".dist-info", ".pth")) and ".." not in str(f)})
        found |= {top for top in tops if top.isidentifier() and _defines_load_environment(top)}
    return [f"{PREFIX}:{name}" for name in sorted(found)]
