"""The event loop and model client through which a verifiers rollout asks us for actions.

Each episode of :class:`~environments.ecosystems.verifiers.VerifiersEnv` runs the env's own
``run_rollout`` coroutine on the process's one private event-loop thread
(:func:`event_loop`), with an ``ActionClient`` (a ``vf.Client``) whose "model" is the
adapter: every model call posts its prompt to the rollout's :class:`_Handover` and waits
for the action the adapter resolves it with. Also here: reading hermes ``<tool_call>``
blocks of an action (:func:`hermes_tool_calls`) and the error a rollout output records.
verifiers is imported on first use only (:func:`_client_class`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import queue
import threading
from typing import Any, Mapping

from trace_gym.env.boundary import MAX_ERROR_CHARS

from trace_gym.env.process_state import process_state_kept
from trace_gym.utils.textsafe import JSONRefused, loads_bounded

#: the model name the env's rollout records
MODEL_NAME = "trace_gym"
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"

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


def replace_if_blocked(loop: asyncio.AbstractEventLoop, wait_s: float = 1.0) -> bool:
    """Whether ``loop`` failed to run a no-op within ``wait_s`` seconds (an env's blocking
    code holds its thread); if so, :func:`event_loop` starts a fresh loop for later
    episodes (the blocked thread is a daemon and is left to its code)."""
    global _LOOP
    try:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=wait_s)
        return False
    except Exception:  # noqa: BLE001  (a timeout, or a loop that is closed: either way not usable)
        with _LOOP_LOCK:
            if _LOOP is not None and _LOOP[1] is loop:
                _LOOP = None
        return True


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
    except BaseException as exc:  # noqa: BLE001  (the env's own failure, SystemExit too: it would stop the
        events.put(("error", exc))  # shared loop; the adapter reports it on the step, wrapped if need be)
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
