"""What the agent loop records: :class:`Turn` (one policy action and the env's answer) and
:class:`Episode` (a live or finished episode: its env, token context and turns).

Plain data, filled in by :class:`trace_gym.agent.loop.AgentRunner` (which re-exports both);
the token layout of a turn is described in :mod:`trace_gym.agent.loop`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable

from trace_gym.budget import BudgetLedger
from trace_gym.env.contract import AgentEnv, Snapshot
from trace_gym.types import Message, Task

__all__ = ["Turn", "Episode"]


@dataclass
class Turn:
    """One completed turn: the policy's action and the env's answer.

    Attributes:
        action_ids / action_logprobs: sampled ids and their sampling logprobs (nats).
        obs_ids: closing + observation-delta ids (loss mask 0).
        snapshot: the env snapshot after this turn (branch point for continuations).
        info: the env's step info; ``{"env_error": ...}`` when the env raised.
        truncation: ``None``, ``"turn_tokens"`` (the action hit ``max_turn_tokens``),
            ``"episode_tokens"`` / ``"max_turns"`` (the episode was cut here) or
            ``"env_error"`` (the env raised on this action; the episode ends here).
    """

    action_ids: tuple[int, ...]
    action_logprobs: tuple[float, ...]
    action_text: str
    finish_reason: str
    obs_ids: tuple[int, ...]
    obs_messages: tuple[Message, ...]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    snapshot: Snapshot | None
    truncation: str | None = None
    cached_tokens: int | None = None


@dataclass(eq=False)
class Episode:
    """A live or finished episode.

    Attributes:
        anchor: an explicit key for the prefix the episode grows from (the driver uses
            ``(tree key, node id)``). Episodes with equal anchors that have not yet
            generated a turn of their own, and have equal contexts, are generated as one
            request with ``n = k``; the key is plain data, so it survives serialisation.
        branch_of: ``(parent uid, turns inherited)`` for a continuation.
        ledger: where this episode's exact costs go (env seconds and steps; tokens and
            generation seconds of its requests).
        error: why the episode ended early (an env exception, a prompt over the token
            limit), else ``None``.
    """

    task: Task
    seed: int
    env: AgentEnv | None
    prompt_ids: tuple[int, ...]
    messages: list[Message]
    tools: list | None
    context: tuple[int, ...]
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    branch_of: tuple[int, int] | None = None
    uid: int = -1
    anchor: Hashable = None
    ledger: BudgetLedger = field(default_factory=BudgetLedger, repr=False)
    error: str | None = None
    env_closed: bool = False

    @property
    def reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def own_turns(self) -> list[Turn]:
        """Turns this episode generated itself (after the inherited prefix)."""
        return self.turns[self.branch_of[1]:] if self.branch_of else self.turns
