"""Multi-turn: open a vault by guessing its code in ``<code>N</code>`` tags, told
``higher``/``lower`` by ``env_response``. ``setup_state`` starts a hint count, a
``@vf.stop`` condition ends the rollout when the vault opens, and the rubric's one reward
function is async (it may sleep ``score_delay`` seconds, as a judge call would):
``1 / (hints + 1)`` when the vault opened, else 0. With ``offline``, ``setup_state`` fails
(a dead service) before the model is asked anything."""

from __future__ import annotations

import asyncio
import re

import verifiers as vf
from datasets import Dataset

CODES = [13, 4, 17, 9, 11]


def guess_of(message) -> int | None:
    """The last ``<code>N</code>`` of a message (``None`` without one)."""
    text = message.content if isinstance(message.content, str) else ""
    found = re.findall(r"<code>\s*(-?\d{1,9})\s*</code>", text)
    return int(found[-1]) if found else None


class VaultEnv(vf.MultiTurnEnv):
    def __init__(self, offline: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.offline = offline  # a dead service: setup fails before the model is asked anything

    async def setup_state(self, state: vf.State) -> None:
        state["hints"] = 0
        if self.offline:
            raise vf.InfraError("the vault service is offline")

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs) -> vf.Messages:
        guess = guess_of(messages[-1])
        if guess is None:
            return [vf.UserMessage(content="Write your guess as <code>N</code>.")]
        state["hints"] += 1
        return [vf.UserMessage(content="higher" if guess < int(state["answer"]) else "lower")]

    @vf.stop
    async def vault_open(self, state: vf.State) -> bool:
        trajectory = state["trajectory"]
        return bool(trajectory) and guess_of(trajectory[-1]["completion"][-1]) == int(state["answer"])


def load_environment(max_turns: int = 5, score_delay: float = 0.0, offline: bool = False) -> vf.Environment:
    rows = [{"question": f"Open vault {i}: its code is between 1 and 20. Guess with <code>N</code>.",
             "answer": str(code), "info": {"vault": i}, "task": "vault"} for i, code in enumerate(CODES)]

    async def opened(completion, answer, state) -> float:
        if score_delay:
            await asyncio.sleep(score_delay)
        replies = [m for m in completion if m.role == "assistant"]
        return 1.0 / (state["hints"] + 1) if replies and guess_of(replies[-1]) == int(answer) else 0.0

    return VaultEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[opened]), max_turns=max_turns,
                    offline=offline)
