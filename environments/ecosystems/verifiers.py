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
holds up the loop, as it would in verifiers; a step past ``step_timeout`` then probes the
loop, and a loop that does not answer within a second is left to the code that blocks it:
the error names that env, and later episodes run on a fresh loop). Building an ``Environment`` registers signal
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

Where the parts live: this module holds the adapter and what the registry calls
(:func:`family`, :func:`available`); the event loop and the model client that hands actions
in are in :mod:`~environments.ecosystems.verifiers_rollout`, building envs and reading their
datasets in :mod:`~environments.ecosystems.verifiers_tasks`, and finding env modules in
:mod:`~environments.ecosystems.verifiers_modules`.

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
the env recorded (``info["env_error"]``), or a step whose env raised (``SystemExit`` in the
rollout included: it is the episode's error, and the shared event loop goes on). ``info`` of the last
step has ``stop_condition`` (the name of the stop that fired) and ``metrics``. A rollout
that ends before the model speaks (``setup_state`` failed) shows its prompt at reset with
``info["env_error"]``, and its first step ends it.

## Snapshot
``replay`` only: a suspended coroutine cannot be copied and the state holds the client, so a
snapshot is the task and the actions, replayed through a fresh rollout (digest-checked).
An env that draws from unseeded randomness in ``env_response`` is refused under replay
(:class:`~trace_gym.env.adapter.ReplayDivergence`).

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
import queue
from typing import Any, Mapping, Sequence

from environments.ecosystems.verifiers_modules import _check_env_args, _load_function, installed_modules
from environments.ecosystems.verifiers_rollout import (
    _client_class, _deliver, _drive, _Handover, _output_error, event_loop, replace_if_blocked,
)
from environments.ecosystems.verifiers_tasks import (
    SPLITS, _is_label, _message, load_env, load_tasks, module_name, tasks_of,
)
from trace_gym.env.adapter import ForeignEnv, options_of
from trace_gym.env.boundary import error_text
from trace_gym.types import Message, Task

PACKAGE = "verifiers"
PREFIX = "verifiers"
ENTRY_POINT = "environments.ecosystems.verifiers:VerifiersEnv"
#: the adapter's own keyword arguments (env kwargs); the id's query goes to load_environment
ENV_OPTIONS = ("max_turns", "snapshot", "split", "step_timeout", "tool_calls", "call_timeout_s", "max_observation_chars")
LOADER_OPTIONS = ("split",)
TOOL_CALL_FORMATS = ("hermes", "none")
#: stop conditions that end a rollout short of the task (truncated rather than terminated)
TRUNCATING_STOPS = ("has_error", "prompt_too_long", "timeout_reached", "max_total_completion_tokens_reached")
#: seconds the boundary's deadline leaves over ``step_timeout`` by default
CALL_MARGIN_S = 60.0


# --- the adapter ---------------------------------------------------------------------------------


class VerifiersEpisode:
    """Episodes of one verifiers env module (a :class:`~trace_gym.env.adapter.ForeignEpisode`):
    each runs the env's own rollout on the shared event loop, with a client that hands the
    model's turns in; ``replay`` only. Arguments as :class:`VerifiersEnv`'s.

    Raises:
        ValueError: a bad ``step_timeout``, ``split`` or ``tool_calls``, or a rubric with
            group-level reward functions (one line each).
    """

    snapshot_strategies = ("replay",)
    global_rng = False

    def __init__(self, module: str, *, env_args: Mapping[str, Any] | None = None, split: str = "train",
                 max_turns: int | None = None, step_timeout: float = 600.0, tool_calls: str = "hermes"):
        if not (isinstance(step_timeout, (int, float)) and step_timeout > 0):
            raise ValueError(f"verifiers:{module}: step_timeout must be positive seconds, got {step_timeout!r}")
        self.max_turns = max_turns
        if split not in SPLITS:
            raise ValueError(f"verifiers:{module}: split must be one of {SPLITS}, got {split!r}")
        if tool_calls not in TOOL_CALL_FORMATS:
            raise ValueError(f"verifiers:{module}: tool_calls must be one of {TOOL_CALL_FORMATS}, got {tool_calls!r}")
        self.module, self.env_args, self.split = module, dict(env_args or {}), split
        self.step_timeout, self.tool_calls = float(step_timeout), tool_calls
        self.vf_env = load_env(module, self.env_args)
        if self.vf_env.rubric.has_group_rewards:
            raise ValueError(f"verifiers:{module}: its rubric has group-level reward functions (scored over a group "
                             "of rollouts together); trace_gym scores each episode alone")
        self._pool: list[Task] | None = None
        self._handover: _Handover | None = None
        self._run: Any = None  # the concurrent.futures.Future of the rollout
        self._loop: Any = None  # the event loop the rollout runs on (:func:`event_loop` when it began)
        self._seen: list[tuple[str, str]] = []  # (role, content) of the conversation so far
        self._early_end: tuple | None = None  # a rollout that ended before the model spoke

    @property
    def env_key(self) -> str:
        return f"{PREFIX}:{self.module}"

    def default_tasks(self) -> Sequence[Task]:
        if self._pool is None:
            self._pool = tasks_of(self.vf_env, self.module, self.split)
        return self._pool

    def _next_event(self) -> tuple:
        try:
            return self._handover.events.get(timeout=self.step_timeout)
        except queue.Empty:
            blocked = replace_if_blocked(self._loop)
            raise TimeoutError(f"verifiers:{self.module} gave no next turn within {self.step_timeout:g} s"
                               + ("; it blocked the shared event loop (blocking code in an async env), so later "
                                  "verifiers episodes run on a fresh loop" if blocked else "")) from None

    def begin(self, task: Task, seed: int):
        row = dict(task.metadata.get("row") or {})
        if not row:  # a Task written by hand: its prompt as the one user message
            row = {"prompt": [{"role": "user", "content": task.prompt}], "answer": task.answer or "",
                   "example_id": 0, "info": {}}
        if _is_label(row.get("task")):
            del row["task"]  # an older env's label (kept as Task.source); verifiers now reads a task payload there
        self._handover, self._seen = _Handover(self.max_turns, self.tool_calls), []
        client = _client_class()(self._handover)
        sampling_args = copy.deepcopy(self.vf_env.sampling_args)  # the env's own; our client ignores them
        self._loop = event_loop()
        self._run = asyncio.run_coroutine_threadsafe(
            _drive(self.vf_env, copy.deepcopy(row), client, sampling_args, self._handover.events), self._loop)
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

    def act(self, action: str):
        if self._early_end is not None:
            return self._finish(self._early_end)
        pending, self._handover.pending = self._handover.pending, None
        self._loop.call_soon_threadsafe(_deliver, pending, action)
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
        reward = output.get("reward")  # as the rubric gave it: the boundary checks it
        return obs, 0.0 if reward is None else reward, not truncated, truncated, info

    @staticmethod
    def _conversation(output: Mapping[str, Any]) -> list:
        return [*(output.get("prompt") or []), *(output.get("completion") or [])]

    def end(self) -> None:
        if self._run is not None and not self._run.done():
            self._run.cancel()  # the rollout's own finally (cleanup handlers) runs on the loop
        self._run = None
        self._handover, self._early_end = None, None

    def load_task(self, task_id: str) -> Task:
        raise ValueError(f"{self.env_key} cannot load a task by id ({task_id!r}); pass the Task")


class VerifiersEnv(ForeignEnv):
    """A verifiers env module under our contract (see the module docstring): a
    :class:`~trace_gym.env.adapter.ForeignEnv` around a :class:`VerifiersEpisode`.

    Args:
        module: the module with ``load_environment``.
        env_args: its keyword arguments.
        split: the dataset ``reset()`` without a task draws from (``train`` or ``eval``).
        max_turns: truncate after this many steps (the rollout is still scored).
        snapshot: ``replay`` (the only strategy).
        step_timeout: seconds a step waits for the env's next turn before it fails (truncated).
        tool_calls: ``hermes`` (read ``<tool_call>`` blocks of envs with tools) or ``none``.
        call_timeout_s: seconds one call into the env may take, waiting included (default:
            ``step_timeout`` + :data:`CALL_MARGIN_S`, so the step's own timeout speaks first).
        max_observation_chars: bound on an observation (characters); see
            :class:`~trace_gym.env.boundary.ForeignBoundary`.
    """

    def __init__(self, module: str, *, env_args: Mapping[str, Any] | None = None, split: str = "train",
                 max_turns: int | None = None, snapshot: str | None = None, step_timeout: float = 600.0,
                 tool_calls: str = "hermes", call_timeout_s: float | None = None,
                 max_observation_chars: int | None = None):
        episode = VerifiersEpisode(module, env_args=env_args, split=split, max_turns=max_turns,
                                   step_timeout=step_timeout, tool_calls=tool_calls)
        super().__init__(episode, snapshot=snapshot, max_turns=max_turns, max_observation_chars=max_observation_chars,
                         call_timeout_s=episode.step_timeout + CALL_MARGIN_S if call_timeout_s is None else call_timeout_s)


# --- the face --------------------------------------------------------------------------------------


def family(name: str, options: dict, env_kwargs: dict, task_kwargs: dict):
    """The :class:`~trace_gym.env.family.EnvFamily` of ``verifiers:<name>?<load_environment kwargs>``.

    Raises:
        ValueError: no such module, no ``load_environment``, or a keyword argument it (or the
            adapter, or the task loader) does not take: one line each, with did-you-mean.
    """
    from trace_gym.env.family import adapter_family

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


def available() -> list[str]:
    """The installed env modules as ids (``verifiers:<module>``): top-level modules of
    distributions that require ``verifiers`` and whose source defines ``load_environment``
    (Environments Hub packages). Found without importing them; may be empty (then name any
    importable module)."""
    return [f"{PREFIX}:{name}" for name in installed_modules()]
