"""BFCL v4 multi-turn function calling on the real backends, graded like the official checker.

Each episode is one BFCL entry (``multi_turn_base_0`` ...): a conversation of user turns
over a scenario of real backend objects from ``bfcl-eval`` (file system, math,
messaging, posting, tickets, trading, travel, vehicle control), instantiated for this
episode alone. Every decoded call runs on those objects and changes their state.

## Action Space
``TextAction``: one model response. ``action_format="python"`` (default, BFCL's
prompting format): a list of calls ``[cd(folder='document'), ls()]``;
``action_format="tool_call"``: Qwen-style ``<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`` blocks. Decoding mirrors bfcl-eval's decoders and never
``eval``s anything (see :mod:`environments.bfcl.parsing`).

## Observation Space
``ChatObservation``. At reset: a system message (BFCL's default system prompt with
the JSON function docs, or the Qwen tools block for ``tool_call``) and the first user
turn (``few_shot`` and ``call_examples`` put demonstrated exchanges between them); with
``tool_prompt="template"`` (``tool_call`` only) just the first user turn,
and ``info["tools"]`` carries the functions for the chat template to render. After a response with calls: one ``tool`` message per call (``name`` is the
decoded call, ``content`` its result or error). After a response without a decodable
call (the model is talking to the user, as in BFCL's inference loop): the next user
turn; on a miss_func holdout turn that is BFCL's "I have updated some more functions"
message carrying the newly available docs. After the last turn: ``[]``.
``info["tool_schemas"]`` (at reset and when docs are revealed) holds the available
functions as OpenAI-style JSON schemas. It is not called ``tools`` by default because
``trace_gym.agent.loop`` forwards ``info["tools"]`` to the chat template, and the system
message already lists them.

## Rewards
0.0 on every step but the last; at the end 1.0 when every user turn passed the official
multi-turn checks (state equality with the ground-truth run and ground-truth results
among the model's results; a turn that expects calls but got none fails), else 0.0.
Each turn is checked when it ends; ``info["turn_check"]`` reports it and
``info["failure"]`` the first failing turn and check.

## Episode End
Terminated after the last user turn. Also terminated (reward 0, failure
``multi_turn:force_terminated``) when a response with calls arrives after
``max_steps_per_turn`` (20, BFCL's limit) call steps in one turn; that response is not
run. Never truncated.

Every observation is valid UTF-8 (lone surrogates that JSON or Python escapes put in
arguments are escaped). A tool message holds at most ``max_result_chars`` of its result
(head 3/4, tail 1/4), and all tool messages of one step at most
``max_observation_chars`` together; a tool message's ``name`` is the call text, cut at
:data:`MAX_NAME_CHARS`. The checker sees each result up to
:data:`MAX_STORED_RESULT_CHARS` (BFCL's longest ground-truth result is 31,706).

## Snapshot
``state``: deep copies (pickle) of the backend instances plus the task, turn and step
position, the model's results so far and the per-turn verdicts. The backend state and
the results may not grow past ``max_state_bytes`` (pickled), nor the backend state nest
deeper than :data:`MAX_STATE_DEPTH` levels: a response whose calls would break either
bound is undone, and each of its tool messages says so; the episode goes on, and every
later ``step``/``snapshot`` works.

## Version History
v0: first version (bfcl-eval 2026.3.23 data and backends).
"""

from __future__ import annotations

import pickle
from typing import Any

import gymnasium

from trace_gym.env.contract import Snapshot, freeze, resolve_task, rng_from_state, rng_state, task_from_options, thaw
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task
from trace_gym.utils.textsafe import clean_text

from environments.bfcl import checker, data
from environments.bfcl.executor import execute_calls, keyword_form, method_table
from environments.bfcl.parsing import ACTION_FORMATS, MAX_ACTION_CHARS, decode, render_action

#: Where the function docs go: the system message, or ``info["tools"]`` for the chat template.
TOOL_PROMPTS = ("system", "template")
#: A one-shot demonstration of BFCL's python format (a call, its result, then a reply
#: without calls that ends the user turn), inserted after the system message when
#: ``few_shot=True``; tiny models imitate it. Its function may not be among the task's.
FEW_SHOT_DEMO = (
    Message("user", "Please make a new folder called 'drafts' in the current directory."),
    Message("assistant", "[mkdir(dir_name='drafts')]"),
    Message("tool", "None", name="mkdir(dir_name='drafts')"),
    Message("assistant", "I created the folder 'drafts'."),
)
#: What a task's difficulty depends on, for the no-contrast warning (``DifficultyKnobs``);
#: the measured success rates are in docs/environments/bfcl.md.
DIFFICULTY_KNOBS = {
    "tier": "task kwarg tier=single_call: the first user turn of an entry whose ground truth is one call, "
            "graded by the same turn checks (the easiest tier; tier=multi_turn: whole entries)",
    "functions": "task kwarg functions=N (single_call tier): the prompt shows the needed function and N-1 others "
                 "(0: every function of the involved classes)",
    "few_shot": "env kwarg few_shot=true: one demonstrated call and reply after the system message",
    "call_examples": "env kwarg call_examples=true: each shown function called once with example values of its "
                     "parameter types, as a demonstrated exchange after the system message",
    "category": "env and task kwarg category: multi_turn_base is the easiest; long_context, miss_func, miss_param add "
                "long state, held-out functions, missing parameters",
}
#: BFCL's MAXIMUM_STEP_LIMIT: call steps allowed per user turn.
MAX_STEPS_PER_TURN = 20
#: The response ``reference_actions`` uses to end a user turn (it holds no call).
END_TURN = "I have completed this request."
#: Characters of one result shown in its tool message (head 3/4, tail 1/4).
MAX_RESULT_CHARS = 65536
#: Characters all tool messages of one step may hold together.
MAX_OBSERVATION_CHARS = 262144
#: Characters of a call's text shown as the tool message's ``name``.
MAX_NAME_CHARS = 512
#: Characters of each result kept for the checker (the longest ground-truth result is 31,706).
MAX_STORED_RESULT_CHARS = 65536
#: Pickled size the backend state plus results may reach.
MAX_STATE_BYTES = 8 << 20
#: Levels of nesting the backend state may reach (objects and containers; the deepest
#: ground-truth state has 12). ``pickle``, ``copy.deepcopy`` and the backends' own
#: ``__eq__`` recurse once or more per level: a file-system tree built by ``mkdir``/``cd``
#: pairs made ``pickle.dumps`` raise ``RecursionError`` at about 190 directories.
MAX_STATE_DEPTH = 48


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: head 3/4, a marker, tail 1/4."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters omitted ...]\n"
    keep = max(limit - len(marker), 0)
    head = keep - keep // 4
    return text[:head] + marker + text[len(text) - (keep - head):]

_ATOMS = (str, bytes, int, float, complex, bool, type(None))
_END = object()


def _members(obj: Any) -> Any:
    if isinstance(obj, dict):
        return [x for item in obj.items() for x in item]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return obj
    attributes = getattr(obj, "__dict__", None)
    return attributes.values() if isinstance(attributes, dict) else ()


def state_depth(root: Any, limit: int) -> int:
    """How deep ``pickle`` recurses into ``root``: its levels of nested objects and
    containers, walked depth-first in pickle's order, each object once (shared and cyclic
    references, such as a directory's ``parent``, are not followed again). Iterative; it
    stops as soon as the depth exceeds ``limit`` and then returns ``limit + 1``."""
    seen = {id(root)}
    stack = [iter(_members(root))]
    deepest = 1
    while stack:
        member = next(stack[-1], _END)
        if member is _END:
            stack.pop()
        elif not isinstance(member, _ATOMS) and id(member) not in seen:
            seen.add(id(member))
            stack.append(iter(_members(member)))
            deepest = max(deepest, len(stack))
            if deepest > limit:
                return limit + 1
    return deepest


# Rendered prompts and tool schemas, keyed by the list of function names they show.
_PROMPTS: dict[tuple, str] = {}
_TOOLS: dict[tuple, list[dict]] = {}


class BFCLEnv(gymnasium.Env):
    """One BFCL v4 multi-turn entry per episode, on the real backends (see module docstring).

    Args:
        category: ``multi_turn_base`` (default), ``multi_turn_long_context``,
            ``multi_turn_miss_func`` or ``multi_turn_miss_param``: the pool that
            ``reset()`` draws from when no task is given (any BFCL task id or
            :class:`Task` may still be passed).
        split: ``all`` (default), ``train`` or ``eval`` (see :mod:`environments.bfcl.data`).
        action_format: ``python`` (BFCL prompting format) or ``tool_call`` (Qwen style).
        max_steps_per_turn: call steps allowed per user turn before force-termination.
        max_action_chars: longer responses are not parsed (they hold no call).
        few_shot: start with :data:`FEW_SHOT_DEMO` after the system message (``python``
            format with ``tool_prompt="system"`` only).
        call_examples: then one demonstrated call of each shown function, with example
            values of its parameter types (``python`` format, ``tool_prompt="system"``).
        tool_prompt: ``system`` (default): the function docs are in the system message,
            as BFCL prompts; ``template`` (``tool_call`` format only): no system
            message, the schemas go to ``info["tools"]`` for the chat template (e.g.
            Qwen's, which renders the same tools block).
        max_result_chars, max_observation_chars, max_state_bytes: the caps above.
    """

    metadata = {"render_modes": []}
    snapshot_mode = "state"
    difficulty_knobs = DIFFICULTY_KNOBS

    @classmethod
    def load_tasks(cls, n: int, seed: int = 0, category: str = "multi_turn_base", split: str = "all") -> list[Task]:
        """The task loader of ``trace_gym/BFCL-v0``: ``n`` distinct entries of ``category`` and
        ``split`` (the env's own defaults), drawn with a seeded permutation
        (:func:`~environments.bfcl.data.sample_tasks`); all of them when ``n`` exceeds the
        category's entries (a loader that runs dry returns fewer)."""
        return data.sample_tasks(min(n, len(data.load_tasks(category, split))), seed, category, split)

    def __init__(self, category: str = "multi_turn_base", split: str = "all", action_format: str = "python",
                 max_steps_per_turn: int = MAX_STEPS_PER_TURN, max_action_chars: int = MAX_ACTION_CHARS,
                 tool_prompt: str = "system", max_result_chars: int = MAX_RESULT_CHARS,
                 max_observation_chars: int = MAX_OBSERVATION_CHARS, max_state_bytes: int = MAX_STATE_BYTES,
                 few_shot: bool = False, call_examples: bool = False):
        data.check_category(category)
        if split not in data.SPLITS:
            raise ValueError(f"split must be one of {data.SPLITS}, got {split!r}")
        if action_format not in ACTION_FORMATS:
            raise ValueError(f"action_format must be one of {ACTION_FORMATS}, got {action_format!r}")
        if max_steps_per_turn < 1:
            raise ValueError(f"max_steps_per_turn must be >= 1, got {max_steps_per_turn}")
        if max_action_chars < 1:
            raise ValueError(f"max_action_chars must be >= 1, got {max_action_chars}")
        for name, value in (("max_result_chars", max_result_chars), ("max_observation_chars", max_observation_chars),
                            ("max_state_bytes", max_state_bytes)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if tool_prompt not in TOOL_PROMPTS:
            raise ValueError(f"tool_prompt must be one of {TOOL_PROMPTS}, got {tool_prompt!r}")
        if tool_prompt == "template" and action_format != "tool_call":
            raise ValueError("tool_prompt='template' needs action_format='tool_call' (BFCL's python format lists docs in the prompt)")
        for name, value in (("few_shot", few_shot), ("call_examples", call_examples)):
            if value and (action_format != "python" or tool_prompt != "system"):
                raise ValueError(f"{name}=True demonstrates the python format after the system message: it needs "
                                 f"action_format='python' and tool_prompt='system', got {action_format!r}, "
                                 f"{tool_prompt!r}")
        self.tool_prompt, self.few_shot, self.call_examples = tool_prompt, few_shot, call_examples
        self.category, self.split, self.action_format = category, split, action_format
        self.max_steps_per_turn, self.max_action_chars = max_steps_per_turn, max_action_chars
        self.max_result_chars, self.max_observation_chars = max_result_chars, max_observation_chars
        self.max_state_bytes = max_state_bytes
        self.tasks = data.load_tasks(category, split)
        self.action_space = TextAction(max_length=max_action_chars)
        self.observation_space = ChatObservation()
        self._task: Task | None = None
        self._reference: checker.Reference | None = None
        self._reference_key: tuple[str, str] | None = None
        self._docs: list[dict] = []
        self._holdout: dict[int, list[dict]] = {}
        self._clear()

    def _clear(self) -> None:
        self._instances: dict[str, Any] = {}
        self._table: dict[str, str] = {}
        self._turn = 0  # index of the current user turn
        self._turn_steps = 0  # call steps taken in the current turn
        self._results: list[str] = []  # every result of the model's calls, all turns
        self._checks: list[dict] = []  # one verdict per finished turn
        self._failure: dict | None = None
        self._steps = 0
        self._done = False
        self._state_blob: bytes | None = None  # pickled instances before the next call step

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = data.validate_task(task_from_options(options, self.tasks, self.np_random, data.load_task))
        self._task = task
        self._clear()
        self._reference_key = checker.reference_key(task)
        self._reference = checker.reference(task, self._reference_key)
        self._instances = self._reference.fresh_instances()
        self._table = method_table(self._instances)
        self._load_docs()
        obs = self._user_turn(0)
        if self.tool_prompt == "system":
            obs = [Message("system", self._system_prompt(self._docs)), *(FEW_SHOT_DEMO if self.few_shot else ()),
                   *(self._call_examples() if self.call_examples else ()), *obs]
        info = {
            "task_id": task.id,
            "category": data.task_category(task),
            "num_turns": len(task.answer),
            "involved_classes": list(task.metadata["involved_classes"]),
            self._tools_key: self._tools(self._docs),
        }
        return obs, info

    def step(self, action: str):
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return [Message("user", "The episode is over.")], 0.0, True, False, {"error": "episode_over"}
        self._steps += 1
        decoded = decode(action, self.action_format, self.max_action_chars)
        info: dict[str, Any] = {"turn": self._turn, "step": self._steps,
                                "tool_calls": [clean_text(c.text) for c in decoded.calls]}
        if decoded.has_calls:
            if self._turn_steps >= self.max_steps_per_turn:
                return self._force_terminate(info)
            results = self._run_calls(decoded.calls, info)
            self._turn_steps += 1
            each = min(self.max_result_chars, max(self.max_observation_chars // len(results), 256))
            shown = [cut(clean_text(r), each) for r in results]
            info["exec"] = [
                {"call": t, "result": r, "refused": c.error is not None}
                for c, t, r in zip(decoded.calls, info["tool_calls"], shown)
            ]
            obs = [Message("tool", r, name=cut(clean_text(c.text), MAX_NAME_CHARS)) for c, r in zip(decoded.calls, shown)]
            return obs, 0.0, False, False, info
        if decoded.error is not None:
            info["decode_error"] = clean_text(decoded.error)
        return self._end_turn(info)

    def close(self) -> None:
        self._task = None
        self._clear()

    def _run_calls(self, calls, info: dict[str, Any]) -> list[str]:
        """Run the calls; undo them all if the state would grow past ``max_state_bytes``
        or nest deeper than :data:`MAX_STATE_DEPTH` (so it can always be pickled)."""
        if self._state_blob is None:
            self._state_blob = pickle.dumps(self._instances)
        results = execute_calls(self._instances, self._table, calls)
        kept = [r[:MAX_STORED_RESULT_CHARS] for r in results]
        depth = state_depth(self._instances, MAX_STATE_DEPTH)
        if depth > MAX_STATE_DEPTH:
            info["state_too_deep"] = depth
            return self._undo(calls, f"would nest the environment state more than {MAX_STATE_DEPTH} levels deep "
                                     "(e.g. directories inside directories)")
        try:
            blob = pickle.dumps(self._instances)
        except Exception as exc:  # not reached within the depth bound; the state must stay snapshottable
            info["state_unpicklable"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            return self._undo(calls, f"would leave the environment state unsaveable ({type(exc).__name__})")
        size = len(blob) + sum(len(r) for r in self._results) + sum(len(r) for r in kept)
        if size > self.max_state_bytes:
            info["state_too_large"] = size
            return self._undo(calls, f"would grow the environment state to {size} bytes, over the limit of "
                                     f"{self.max_state_bytes}")
        self._state_blob = blob
        self._results.extend(kept)
        return results

    def _undo(self, calls, why: str) -> list[str]:
        """Put back the state before this response's calls; one error result per call."""
        self._instances = pickle.loads(self._state_blob)
        self._table = method_table(self._instances)
        return [f"Error: the calls of this response {why}; all of them were undone."] * len(calls)

    # -- turns --------------------------------------------------------------------
    def _end_turn(self, info: dict[str, Any]):
        truths = self._reference.truths
        verdict = checker.check_turn(self._turn, truths[self._turn], self._turn_steps > 0, self._instances, self._results)
        self._checks.append(verdict.to_dict())
        if not verdict.passed and self._failure is None:
            self._failure = verdict.to_dict()
        info["turn_end"] = True
        info["turn_check"] = verdict.to_dict()
        self._turn += 1
        self._turn_steps = 0
        if self._turn < len(truths):
            obs = self._user_turn(self._turn)
            if self._turn in self._holdout:
                info["revealed_functions"] = [d["name"] for d in self._holdout[self._turn]]
                info[self._tools_key] = self._tools(self._available_docs())
            return obs, 0.0, False, False, info
        return self._finish(info)

    def _user_turn(self, turn: int) -> list[Message]:
        if turn in self._holdout:
            return [Message("user", data.holdout_user_prompt(self._holdout[turn]))]
        return [Message(m["role"], m["content"]) for m in self._task.metadata["question"][turn]]

    def _call_examples(self) -> list[Message]:
        """Per shown function, a request to call it with example values and the call
        (:func:`~environments.bfcl.data.example_call`); the values come from the schema,
        never from the task, and every shown function gets one, so none is singled out."""
        demo = []
        for doc in self._docs:
            name, kwargs = data.example_call(doc)
            args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            demo += [Message("user", f"Example: call {name}" + (f" with {args}." if args else ".")),
                     Message("assistant", render_action([(name, kwargs)], "python"))]
        return demo

    def _available_docs(self) -> list[dict]:
        """Docs shown so far: the initial ones plus those revealed up to this turn."""
        return self._docs + [d for t in sorted(self._holdout) if t <= self._turn for d in self._holdout[t]]

    def _load_docs(self) -> None:
        self._docs, self._holdout = data.function_docs(data.task_entry(self._task))

    def _finish(self, info: dict[str, Any]):
        self._done = True
        reward = 1.0 if self._failure is None else 0.0
        info.update(self._outcome())
        return [], reward, True, False, info

    def _force_terminate(self, info: dict[str, Any]):
        self._done = True
        verdict = checker.TurnCheck(
            self._turn, False, checker.FORCE_TERMINATED,
            f"Model was force-terminated after {self.max_steps_per_turn} steps in turn {self._turn}.",
        )
        self._checks.append(verdict.to_dict())
        if self._failure is None:
            self._failure = verdict.to_dict()
        info["force_terminated"] = True
        info["turn_check"] = verdict.to_dict()
        info.update(self._outcome())
        return [], 0.0, True, False, info

    def _outcome(self) -> dict[str, Any]:
        n_turns = len(self._task.answer)
        return {
            "task_id": self._task.id,
            "category": data.task_category(self._task),
            "valid": self._failure is None,
            "failure": self._failure,
            "turn_checks": list(self._checks),
            "reward_components": {
                "turns_passed": sum(1 for c in self._checks if c["passed"]),
                "turns": n_turns,
                "all_turns_passed": float(self._failure is None),
            },
        }

    def _system_prompt(self, docs: list[dict]) -> str:
        key = (self.action_format, tuple(d["name"] for d in docs))
        if key not in _PROMPTS:  # docs are fixed per function-name list; the JSON dump is slow
            build = data.bfcl_system_prompt if self.action_format == "python" else data.tool_call_system_prompt
            _PROMPTS[key] = build(docs)
        return _PROMPTS[key]

    @property
    def _tools_key(self) -> str:
        return "tools" if self.tool_prompt == "template" else "tool_schemas"

    @staticmethod
    def _tools(docs: list[dict]) -> list[dict]:
        key = tuple(d["name"] for d in docs)
        if key not in _TOOLS:
            _TOOLS[key] = data.openai_tools(docs)
        return list(_TOOLS[key])  # shared schema dicts: read them, do not mutate them

    # -- snapshot contract -------------------------------------------------------
    def snapshot(self) -> Snapshot:
        if self._task is None:
            raise RuntimeError("call reset() before snapshot()")
        state = (
            self._task, self._reference_key, self._instances, self._turn, self._turn_steps, self._results,
            self._checks, self._failure, self._steps, self._done, rng_state(self._np_random),
        )
        return Snapshot(type(self).__name__, self.snapshot_mode, self._steps, freeze(state))

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != type(self).__name__:
            raise ValueError(f"snapshot from {snapshot.env_id!r} cannot restore a {type(self).__name__}")
        (self._task, self._reference_key, self._instances, self._turn, self._turn_steps, self._results,
         self._checks, self._failure, self._steps, self._done, rng) = thaw(snapshot.state)
        self._table = method_table(self._instances)
        self._state_blob = None
        self._reference = checker.reference(self._task, self._reference_key)
        self._load_docs()
        if rng is not None and self._np_random is not None and type(self._np_random.bit_generator).__name__ == rng["bit_generator"]:
            self._np_random.bit_generator.state = rng  # copies the state; cheaper than a new Generator
        else:
            self._np_random = rng_from_state(rng)

    # -- helpers -----------------------------------------------------------------
    def reference_actions(self, task: Task | str) -> list[str]:
        """The ground-truth run as responses: per user turn, one response with all its
        calls (positional arguments named, since BFCL's decoder drops them), then
        :data:`END_TURN` to end the turn. Replaying it scores 1.0."""
        task = data.validate_task(resolve_task(task, data.load_task))
        table = method_table(checker.new_instances(task))
        actions = []
        for turn in task.answer:
            if turn:
                actions.append(render_action([keyword_form(table, text) for text in turn], self.action_format))
            actions.append(END_TURN)
        return actions
