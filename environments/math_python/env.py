"""MathPython: solve a math problem with a persistent, sandboxed Python interpreter.

The agent reasons, runs Python code, reads the output, and finally answers. Reward 1
when its final ``\\boxed{}`` answer is mathematically equivalent to the gold answer
(math-verify, gold first).

## Action Space
``TextAction``: the model's raw text for one turn. Every fenced block opened with
```` ```python ````, ```` ```py ```` or ```` ```python3 ```` *and closed* with ```` ``` ````
is a cell; cells run in order in one interpreter per episode, so variables, imports and
files persist across cells and turns. Text outside the fences is never executed.

## Observation Space
``ChatObservation``. ``reset`` returns ``[system, user]``: ``system_prompt`` and
``prompt_template.format(question=...)``. A step with code returns one message (role
``observation_role``) holding, for each cell, ``output_template.format(output=...)``
(joined by a blank line), where ``output`` is, in this order, the cell's stdout, its
stderr, then its traceback or a notice; ``empty_output`` when all are empty. A stream
larger than ``KernelLimits.output_bytes`` keeps its first 3/4 and last 1/4 around
``truncation_marker``. The default format::

    ```output
    <stdout><stderr><traceback>
    ```

A cell that hits the wall-clock limit, or kills the interpreter (segfault, ``os._exit``,
CPU limit), ends with ``timeout_notice`` / ``crash_notice`` (with the real cause): the
interpreter was restarted, and every variable, import and file of earlier cells is
lost; the next cell runs in the new interpreter. If the interpreter died *between*
cells (a background thread or process killed it), the next cell runs in a new one and
its block starts with ``restart_notice``. Output printed between cells by background
threads or processes is shown, labelled by ``background_notice``, before the next
cell's output. Limits per response: ``max_action_chars`` (a longer response is not run
and not graded), ``max_cells`` code blocks (the rest are not run, ``cells_notice``),
``step_timeout_s`` seconds of code in total, the cells' own run time (later cells are not
run, ``skipped_notice``; starting a kernel is not charged, so a loaded machine does not
skip a response's cells), ``max_observation_chars`` of observation. Nothing is ever re-run
behind the model's back. The step that ends the episode returns
``[Message(role, final_message)]``. Every observation is valid UTF-8 (lone surrogates
are escaped).

## Rewards
0.0 on every step but the last; on the step whose action has no code block, 1.0 if its
last boxed answer is equivalent to the task's answer (see ``grading.py`` for the
extraction rules), else 0.0. ``info["grading"]`` says what was extracted and why.
When the reward could not be computed (no grader worker could run, or no kernel could
be started), ``info["infra_error"]`` holds the reason and
``info["reward_components"]["infra_error"]`` is 1.0: the reward (0.0) means nothing,
and a trainer must drop the episode rather than count it as wrong.

## Episode End
Terminated by the first action without a code block (that action is graded).
Truncated, with reward 0, when ``max_turns`` actions with code (or over-long actions)
have been taken, when no kernel could be started (``info["infra_error"]``), or when the
replay after a restore ran out of ``replay_timeout_s`` (``info["env_error"]``).

## Info
``info["exec"]`` (steps with code): ``status`` (worst of ``ok`` < ``error`` <
``timeout`` < ``crashed``), ``timed_out``, ``oom``, ``elapsed`` (host seconds),
``kernel_restarted`` and ``cells`` (one dict per cell, with ``skipped`` cells marked);
after a restore, ``replay`` reports the cells re-executed and any that diverged.

## Snapshot
``replay``: the snapshot records the task, the episode seed, the turn, the kernel
generation (how many times the interpreter was restarted) and the cells executed in
the current interpreter with their status. ``restore`` discards the live interpreter
and forks a fresh one seeded with ``(episode seed, generation)`` (milliseconds; it sets
itself up while the policy generates); the next cell re-executes the recorded cells in
it first, discarding their output. Deterministic for code
whose behaviour depends only on its inputs and the seeded ``random``/``numpy.random``
(hash seed fixed to 0); not for wall-clock time, ``id()``/addresses, ``os.urandom``,
PIDs, or cells near the time limit. The replay has its own budget, ``replay_timeout_s``
(default ``step_timeout_s``) for all recorded cells together, before the step's own
cells get their ``step_timeout_s``; a replay that runs out of it ends the episode,
truncated, with ``info["env_error"]`` and an observation that says so (reward 0).

## Version History
v0: first version.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any, Sequence

import gymnasium

from environments.math_python.data import load_tasks
from environments.math_python.generated import generate_tasks
from environments.math_python.grading import EXTRACTIONS, Grader, normalize_answer
from environments.math_python.observations import (
    ACTION_TOO_LONG, BACKGROUND_NOTICE, CELLS_NOTICE, CRASH_NOTICE, FEW_SHOT_DEMO, INFRA_NOTICE, OUTPUT_TEMPLATE,
    REPLAY_TIMEOUT_NOTICE, RESTART_NOTICE, SKIPPED_NOTICE, STARTS_NOTICE, SYSTEM_PROMPT, TIMEOUT_NOTICE, TRUNCATION_MARKER,
    cap_observation, format_cell)
from environments.math_python.replay import kernel_seed, replay_cells
from environments.math_python.sandbox import CellResult, Kernel, KernelError, KernelFactory, KernelLimits
from environments.math_python.zygote import ForkServer
from trace_gym.env.contract import Snapshot, freeze, resolve_task, rng_from_state, rng_state, task_from_options, thaw
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task
from trace_gym.utils.textsafe import clean_text

CODE_BLOCK = re.compile(r"```(?:python3|python|py)[ \t]*\r?\n(.*?)```", re.DOTALL)

#: Characters of the response the env reads; longer responses are refused.
MAX_ACTION_CHARS = 65536
_SEVERITY = {"ok": 0, "error": 1, "timeout": 2, "crashed": 3}


def extract_code_blocks(text: str) -> list[str]:
    """The cells of one action: closed ```python / ```py / ```python3 fences, in order."""
    return CODE_BLOCK.findall(text) if isinstance(text, str) else []


@functools.lru_cache(maxsize=1)
def default_tasks() -> tuple[Task, ...]:
    """The default pool (64 generated tasks, difficulty 0-2), made once per process, on first use."""
    return tuple(generate_tasks(64, difficulty=(0, 1, 2), seed=0))


class MathPythonEnv(gymnasium.Env):
    """Math problems with a persistent sandboxed Python tool (spec in the module docstring).

    Args:
        tasks: the pool ``reset()`` draws from: a list of ``Task``/task dicts, or a
            dataset name for :func:`load_tasks`; default: 64 generated tasks of
            difficulty 0-2.
            The default pool is made on first use (never, when every reset names a task).
        max_turns: actions with code before truncation.
        limits: :class:`KernelLimits` (or a dict of its fields).
        isolate: sandbox the interpreter (namespaces, own uid) where the host allows.
        prestart_kernel: start the process-wide kernel fork server (and the grader's)
            in the background now, so the first cell does not wait for imports.
        max_action_chars: longer responses are not run and not graded.
        max_cells: code blocks run per response; later ones are not run.
        step_timeout_s: seconds all cells of one response may run together (run time, kernel starts excluded).
        max_kernel_starts: Python sessions one response may start (a cell needing one more is not run,
            ``starts_notice``): with ``step_timeout_s`` it bounds a step's wall time.
        max_observation_chars: longest observation (head 3/4 and tail 1/4 kept).
        system_prompt, prompt_template: the first observation (``{question}`` field).
        output_template, empty_output, truncation_marker, timeout_notice,
            crash_notice, skipped_notice, restart_notice, background_notice,
            cells_notice, final_message: observation text (see the module docstring;
            fields ``{output}``, ``{omitted}``, ``{limit}``, ``{reason}``, ``{count}``).
        observation_role: ``"user"`` or ``"tool"``.
        grader: a :class:`Grader`; default: the process-wide shared one.
        kernel_server: the :class:`ForkServer` kernels are forked from; default: the
            process-wide one.
        replay_timeout_factor: a replayed cell may run this many times the cell limit
            (within ``replay_timeout_s``).
        replay_timeout_s: seconds the replay after a restore may take, all recorded
            cells together (default: ``step_timeout_s``); past it the episode ends
            (truncated, ``info["env_error"]``).
        few_shot: start with :data:`FEW_SHOT_DEMO` after the system prompt.
        answer_extraction: ``"boxed"`` (default: the last ``\\boxed{}``) or
            ``"boxed_or_last_number"`` (fall back to the last number; for tiny models).
    """

    metadata = {"render_modes": []}
    snapshot_mode = "replay"

    @classmethod
    def load_tasks(cls, n: int, seed: int = 0, difficulty: int | Sequence[int] = (0, 1, 2)) -> list[Task]:
        """The task loader of ``trace_gym/MathPython-v0``: ``n`` generated problems of the
        default pool's kind (:func:`~environments.math_python.generated.generate_tasks`,
        ``difficulty`` 0-2, seeded), offline."""
        return generate_tasks(n, difficulty=difficulty, seed=seed)

    def __init__(self, tasks: Sequence[Task | dict] | str | None = None, *, max_turns: int = 4,
                 limits: KernelLimits | dict | None = None, isolate: bool = True, prestart_kernel: bool = True,
                 system_prompt: str = SYSTEM_PROMPT, prompt_template: str = "{question}",
                 output_template: str = OUTPUT_TEMPLATE, empty_output: str = "(no output)",
                 truncation_marker: str = TRUNCATION_MARKER, timeout_notice: str = TIMEOUT_NOTICE,
                 crash_notice: str = CRASH_NOTICE, skipped_notice: str = SKIPPED_NOTICE,
                 final_message: str = "Final answer received.", observation_role: str = "user",
                 grader: Grader | None = None, replay_timeout_factor: float = 3.0,
                 answer_extraction: str = "boxed", few_shot: bool = False,
                 max_action_chars: int = MAX_ACTION_CHARS, max_cells: int = 8, step_timeout_s: float = 30.0,
                 max_observation_chars: int = 32768, restart_notice: str = RESTART_NOTICE,
                 background_notice: str = BACKGROUND_NOTICE, cells_notice: str = CELLS_NOTICE,
                 kernel_server: ForkServer | None = None, replay_timeout_s: float | None = None,
                 max_kernel_starts: int = 3, starts_notice: str = STARTS_NOTICE):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if observation_role not in ("user", "tool"):
            raise ValueError(f"observation_role must be 'user' or 'tool', got {observation_role!r}")
        if "{output}" not in output_template:
            raise ValueError(f"output_template must contain '{{output}}', got {output_template!r}")
        replay_timeout_s = step_timeout_s if replay_timeout_s is None else replay_timeout_s
        for name, value in (("max_action_chars", max_action_chars), ("max_cells", max_cells),
                            ("step_timeout_s", step_timeout_s), ("max_observation_chars", max_observation_chars),
                            ("replay_timeout_s", replay_timeout_s), ("replay_timeout_factor", replay_timeout_factor),
                            ("max_kernel_starts", max_kernel_starts)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if isinstance(tasks, str):
            tasks = load_tasks(tasks)
        self._tasks = None if tasks is None else [resolve_task(t) for t in tasks]
        if self._tasks is not None and not self._tasks:
            raise ValueError("MathPythonEnv needs at least one task")
        self.max_turns = max_turns
        self.limits = KernelLimits(**limits) if isinstance(limits, dict) else (limits or KernelLimits())
        self.templates = {
            "system": system_prompt, "prompt": prompt_template, "output": output_template,
            "empty": empty_output, "truncation": truncation_marker, "timeout": timeout_notice,
            "crash": crash_notice, "skipped": skipped_notice, "final": final_message, "restart": restart_notice,
            "background": background_notice, "cells": cells_notice, "starts": starts_notice,
        }
        self.max_kernel_starts = int(max_kernel_starts)
        self.max_action_chars, self.max_cells = int(max_action_chars), int(max_cells)
        self.step_timeout_s, self.max_observation_chars = float(step_timeout_s), int(max_observation_chars)
        self.observation_role = observation_role
        self.replay_timeout_factor, self.replay_timeout_s = float(replay_timeout_factor), float(replay_timeout_s)
        if answer_extraction not in EXTRACTIONS:
            raise ValueError(f"answer_extraction must be one of {EXTRACTIONS}, got {answer_extraction!r}")
        self.answer_extraction = answer_extraction
        self.few_shot = few_shot
        self._grader = grader
        self._factory = KernelFactory(self.limits, isolate=isolate, prestart=prestart_kernel, server=kernel_server)
        if prestart_kernel:
            self.grader.start_background()
        self.action_space = TextAction(max_length=self.max_action_chars)
        self.observation_space = ChatObservation()
        self._task: Task | None = None
        self._episode_seed = 0
        self._turn = 0
        self._done = False
        self._generation = 0
        self._cells: list[tuple[str, str]] = []  # (code, status) run in the live interpreter
        self._kernel: Kernel | None = None
        self._prefetched: tuple[int, Kernel] | None = None  # (seed, kernel) forked by restore()
        self._replay_report: dict | None = None
        self.kernel_protections: dict = {}

    @property
    def tasks(self) -> list[Task]:
        """The pool ``reset()`` draws from (the default pool is made on first access)."""
        if self._tasks is None:
            self._tasks = list(default_tasks())
        return self._tasks

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        named = options is not None and options.get("task", options.get("task_id")) is not None
        task = task_from_options(options, () if named else self.tasks, self.np_random, self._load, require_answer=True)
        self._close_kernel()
        self._task = task
        self._episode_seed = int(self.np_random.integers(2**31))
        self._turn, self._done, self._generation, self._cells = 0, False, 0, []
        self._replay_report = None
        demo = [Message(role, text) for role, text in FEW_SHOT_DEMO] if self.few_shot else []
        obs = [Message("system", self.templates["system"]), *demo,
               Message("user", clean_text(self.templates["prompt"].format(question=task.prompt)))]
        return obs, {"task_id": task.id, "episode_seed": self._episode_seed}

    def step(self, action: str):
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return ([Message(self.observation_role, "The episode is over.")], 0.0, True, False,
                    {"error": "episode_over", "turn": self._turn})
        self._turn += 1
        info: dict[str, Any] = {"turn": self._turn, "task_id": self._task.id}
        text = action if isinstance(action, str) else ""
        if len(text) > self.max_action_chars:  # not run, not graded: a turn spent
            self._done = self._turn >= self.max_turns
            info.update(exec=None, action_too_long=len(text), reward_components={"correct": 0.0})
            message = self.templates["output"].format(output=ACTION_TOO_LONG.format(
                length=len(text), limit=self.max_action_chars))
            return [Message(self.observation_role, message)], 0.0, False, self._done, info
        cells = extract_code_blocks(text)
        if not cells:
            return self._final(text, info)
        return self._run_cells(cells, info)

    def _final(self, text: str, info: dict[str, Any]):
        result = self.grader.grade(text, self._task.answer, self.answer_extraction)
        reward = 1.0 if result.correct else 0.0
        self._done = True
        info.update(exec=None, grading=result.info(),
                    reward_components={"correct": reward, "infra_error": float(result.infra_error)})
        if result.infra_error:
            info["infra_error"] = result.reason
        return [Message(self.observation_role, self.templates["final"])], reward, True, False, info

    def _run_cells(self, cells: list[str], info: dict[str, Any]):
        blocks, cell_infos, restarted, infra = [], [], False, None
        worst = "ok"
        if self._kernel is None and self._cells:  # the first step after a restore: rebuild the state first
            try:
                if not self._replay():
                    return self._replay_timed_out(cells, info)
            except KernelError as exc:
                infra = f"no Python kernel could be started: {exc}"
        # the budget is the cells' run time (a start is the sandbox's cost); starts are capped, so wall <= budget + starts
        spent, starts = 0.0, 0
        for code in cells[: self.max_cells]:
            left = self.step_timeout_s - spent
            needs_start = self._kernel is None
            if infra is not None or left <= 0 or (needs_start and starts >= self.max_kernel_starts):
                notice = (INFRA_NOTICE if infra is not None
                          else self.templates["skipped"].format(limit=self.step_timeout_s) if left <= 0
                          else self.templates["starts"].format(count=starts))
                blocks.append(self.templates["output"].format(output=notice))
                cell_infos.append({"status": "skipped"})
                continue
            starts += needs_start
            limit = min(self.limits.cell_timeout_s, left)
            try:
                result, note = self._execute(code, limit)
            except KernelError as exc:  # no kernel could be started, even by a fresh fork server
                infra = f"no Python kernel could be started: {exc}"
                blocks.append(self.templates["output"].format(output=INFRA_NOTICE))
                cell_infos.append({"status": "skipped"})
                continue
            spent += result.elapsed
            starts += note is not None  # the kernel had died in the background: this cell started another
            if not result.kernel_alive:  # the interpreter is gone: a new generation starts empty
                self._close_kernel()
                self._generation += 1
                self._cells = []
                restarted = True
            elif result.status != "dead":
                self._cells.append((code, result.status))
            if note is not None:
                restarted = True
            worst = max(worst, result.status, key=_SEVERITY.__getitem__)
            body = format_cell(result, self.templates, limit, step_cut=limit < self.limits.cell_timeout_s)
            blocks.append(self.templates["output"].format(output=body if note is None else f"{note}\n{body}"))
            cell_infos.append(dict(result.info(), restarted_before=note is not None))
        if len(cells) > self.max_cells:
            blocks.append(self.templates["output"].format(output=self.templates["cells"].format(
                count=len(cells) - self.max_cells, limit=self.max_cells)))
        truncated = self._turn >= self.max_turns or infra is not None
        self._done = truncated
        ran = [c for c in cell_infos if c["status"] != "skipped"]
        info["exec"] = {
            "status": worst, "timed_out": any(c["timed_out"] for c in ran), "oom": any(c["oom"] for c in ran),
            "elapsed": sum(c["elapsed"] for c in ran), "kernel_restarted": restarted, "cells": cell_infos,
            "cells_not_run": max(0, len(cells) - self.max_cells) + len(cell_infos) - len(ran),
        }
        if self._replay_report is not None:
            info["exec"]["replay"], self._replay_report = self._replay_report, None
        info["reward_components"] = {"correct": 0.0, "infra_error": float(infra is not None)}
        if infra is not None:
            info["infra_error"] = infra
        observation = cap_observation("\n\n".join(blocks), self.max_observation_chars, self.templates["truncation"])
        return [Message(self.observation_role, observation)], 0.0, False, truncated, info

    def _replay_timed_out(self, cells: list[str], info: dict[str, Any]):
        """The step after a replay that ran out of its budget: the episode ends, truncated."""
        report, self._replay_report = self._replay_report, None
        self._done = True
        notice = REPLAY_TIMEOUT_NOTICE.format(cells=report["cells"], limit=self.replay_timeout_s)
        run = min(len(cells), self.max_cells)
        info["exec"] = {"status": "timeout", "timed_out": True, "oom": False, "elapsed": 0.0,
                        "kernel_restarted": True, "cells": [{"status": "skipped"}] * run, "cells_not_run": len(cells),
                        "replay": report}
        info["env_error"] = (f"replay_timeout: rebuilding the interpreter after a restore took over "
                             f"{self.replay_timeout_s:g} s (replay_timeout_s); {report['replayed']} of "
                             f"{report['cells']} recorded cells re-run")
        # Not an infrastructure error: the slow cells are the policy's own, and an excluded
        # episode would be a way to dodge the reward of its continuation.
        info["reward_components"] = {"correct": 0.0, "infra_error": 0.0}
        message = self.templates["output"].format(output=notice)
        return [Message(self.observation_role, message)], 0.0, False, True, info

    def _execute(self, code: str, limit: float) -> tuple[CellResult, str | None]:
        """Run one cell; if the kernel had died since the last cell, run it in a new one
        and return the notice that says so. Raises KernelError when no kernel starts."""
        result = self._ensure_kernel().execute(code, timeout=limit)
        if result.status != "dead":
            return result, None
        note = self.templates["restart"].format(reason=result.error)
        self._close_kernel()
        self._generation += 1
        self._cells = []
        result = self._ensure_kernel().execute(code, timeout=limit)
        if result.status == "dead":  # twice in a row: report it as this cell's crash
            result = CellResult(status="crashed", error=result.error, error_name=result.error_name,
                                elapsed=result.elapsed, kernel_alive=False)
        return result, note

    def close(self) -> None:
        self._close_kernel()
        self._factory.close()

    # -- snapshot contract -------------------------------------------------------
    def snapshot(self) -> Snapshot:
        state = {
            "task": self._task, "episode_seed": self._episode_seed, "turn": self._turn, "done": self._done,
            "generation": self._generation, "cells": tuple(self._cells), "rng": rng_state(self._np_random),
        }
        return Snapshot(type(self).__name__, self.snapshot_mode, self._turn, freeze(state))

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != type(self).__name__:
            raise ValueError(f"snapshot from {snapshot.env_id!r} cannot restore a {type(self).__name__}")
        if snapshot.mode != self.snapshot_mode:
            raise ValueError(f"expected a {self.snapshot_mode!r} snapshot, got {snapshot.mode!r}")
        state = thaw(snapshot.state)
        self._close_kernel()  # the interpreter is rebuilt (and the cells replayed) at the next cell
        self._task, self._episode_seed, self._turn = state["task"], state["episode_seed"], state["turn"]
        self._done, self._generation, self._cells = state["done"], state["generation"], list(state["cells"])
        self._np_random = rng_from_state(state["rng"])
        self._replay_report = None
        if not self._done:  # fork the next kernel now: it sets itself up while the policy generates
            seed = kernel_seed(self._episode_seed, self._generation)
            try:
                self._prefetched = (seed, self._factory.new_kernel(seed))
            except KernelError:
                pass  # the first cell tries again, and reports an infrastructure error if it must

    def replay_steps(self, snapshot: Snapshot) -> int:
        """Cells a restore of ``snapshot`` re-executes (``trace_gym.env.contract.ReplayCost``): the
        agent loop counts them as env steps, so exact costs include branching's price."""
        return len(thaw(snapshot.state)["cells"])

    # -- helpers -----------------------------------------------------------------
    def sandbox_mechanisms(self) -> dict[str, str]:
        """Which sandbox mechanisms this env's kernels get (memory cgroup, seccomp, private
        IPC, user namespaces refused), each ``active: ...`` or ``NOT active (why)``; starts
        the fork server if needed. Each kernel's own outcome: :attr:`kernel_protections`."""
        return self._factory.server.mechanisms()

    @property
    def grader(self) -> Grader:
        if self._grader is None:
            self._grader = Grader.shared()
        return self._grader

    def reference_actions(self, task: Task) -> list[str]:
        """A script with state across turns (seeded ``random``, numpy, a file, an error) then the answer."""
        return [
            "Let me draw some numbers.\n```python\nimport random\nfirst = random.randint(1, 10**6)\n"
            "draws = [random.random() for _ in range(3)]\nprint(first)\n```",
            "```python\nimport numpy as np\ndraws.append(float(np.random.rand()))\n"
            "open('notes.txt', 'w').write(str(first))\nprint(len(draws), round(sum(draws), 6), random.random())\n```",
            "Checking state.\n```python\nprint(open('notes.txt').read() == str(first), undefined_name)\n```\n"
            "```python\ndraws[-1]\n```",
            f"The answer is \\boxed{{{normalize_answer(task.answer)}}}.",
        ]

    def _ensure_kernel(self) -> Kernel:
        """The live interpreter, built when needed (after a restore, :meth:`_replay` has
        rebuilt it before the step's first cell)."""
        if self._kernel is None:
            self._kernel = self._new_kernel()
        return self._kernel

    def _replay(self) -> bool:
        """Re-run the recorded cells in a fresh kernel of this generation, all within
        ``replay_timeout_s`` (each within ``replay_timeout_factor`` cell limits too);
        their output is discarded. Sets the replay report; returns False when the budget
        ran out (the kernel is then closed). Raises KernelError when no kernel starts."""
        per_cell = self.limits.cell_timeout_s * self.replay_timeout_factor
        kernel, self._replay_report = replay_cells(self._new_kernel, self._cells, per_cell, self.replay_timeout_s)
        if kernel is None:
            return False
        self._kernel = kernel
        return True

    def _new_kernel(self) -> Kernel:
        """A ready kernel for the current generation; one retry (a kernel that died while
        starting is an infrastructure fault). Raises KernelError."""
        seed = kernel_seed(self._episode_seed, self._generation)
        for attempt in (0, 1):
            kernel = None
            try:
                prefetched, self._prefetched = self._prefetched, None
                if prefetched is not None and prefetched[0] == seed and prefetched[1].alive:
                    kernel = prefetched[1]
                else:
                    if prefetched is not None:
                        prefetched[1].close()
                    kernel = self._factory.new_kernel(seed)
                self.kernel_protections = kernel.wait_ready()["protections"]
                return kernel
            except KernelError:
                if kernel is not None:
                    kernel.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _close_kernel(self) -> None:
        """Close the live kernel and any prefetched one."""
        for kernel in (self._kernel, self._prefetched and self._prefetched[1]):
            if kernel is not None:
                kernel.close()
        self._kernel = self._prefetched = None

    def _load(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(f"unknown task id {task_id!r}")
