"""The token-in-token-out agent loop.

An episode's history is carried as token ids and never re-tokenised: the policy's
sampled ids are kept as generated, and each observation contributes only the chat
template's *delta* for the new messages. :class:`ChatRenderer` computes that delta and
fails loudly (:class:`TemplateError`) when the template is not append-only for a turn
(for example templates that rewrite earlier assistant turns).

Token layout of one turn (``mask`` is the loss mask)::

    [action ids (mask 1)] [closing ids (mask 0)] [observation delta ids (mask 0)]

``closing ids`` are the template tokens after an assistant message's content that
the model did not generate: the end-of-turn token when generation stopped for another
reason (a stop string, the token limit), plus the template's glue after it (``"\\n"``
for ChatML). :class:`AgentRunner` steps many episodes at once: one batched
``engine.generate`` call per step for all live episodes (branches that share a prefix
go in as one prefix with ``n = k``), env steps in a thread pool.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from trace_gym.budget import BudgetLedger
from trace_gym.env import Snapshot
from trace_gym.types import Message, SamplingParams, Task


class TemplateError(RuntimeError):
    """The chat template is not append-only for this turn."""


class ChatRenderer:
    """Renders env messages to token ids with a tokenizer's chat template.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        end_of_turn: the token that ends an assistant message (default: the
            tokenizer's eos token).
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat template")
        self.tokenizer = tokenizer
        eot = end_of_turn or tokenizer.eos_token
        self.end_of_turn_id: int = tokenizer.convert_tokens_to_ids(eot)
        if self.end_of_turn_id is None or self.end_of_turn_id == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn token {eot!r} is not in the vocabulary")
        self.closing_ids: tuple[int, ...] = self._closing_ids()

    def render(self, messages: Sequence[dict], *, generation_prompt: bool, tools: list | None = None) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=generation_prompt, tokenize=True,
            return_dict=False,
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        return [int(t) for t in out]

    def _closing_ids(self) -> tuple[int, ...]:
        """Template tokens from the end-of-turn token to the end of an assistant message."""
        base = [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}]
        ids = self.render(base, generation_prompt=False)
        positions = [i for i, t in enumerate(ids) if t == self.end_of_turn_id]
        if not positions:
            raise TemplateError("the chat template does not end assistant messages with the end-of-turn token")
        return tuple(ids[positions[-1]:])

    def prompt(self, messages: Sequence[Message], tools: list | None = None) -> list[int]:
        """Token ids of the first observation plus the generation prompt."""
        return self.render([m.to_dict() for m in messages], generation_prompt=True, tools=tools)

    def observation(self, history: Sequence[Message], new: Sequence[Message], tools: list | None = None) -> list[int]:
        """The template delta that appends ``new`` after ``history`` (which ends with
        the assistant's message) and opens the next assistant turn."""
        before = self.render([m.to_dict() for m in history], generation_prompt=False, tools=tools)
        after = self.render([m.to_dict() for m in (*history, *new)], generation_prompt=True, tools=tools)
        if after[: len(before)] != before:
            at = next(i for i, (a, b) in enumerate(zip(before, after)) if a != b) if any(
                a != b for a, b in zip(before, after)) else min(len(before), len(after))
            raise TemplateError(
                f"chat template is not append-only: adding {len(new)} message(s) changed token {at} of the "
                f"history ({self.tokenizer.decode(before[at:at + 8])!r} -> {self.tokenizer.decode(after[at:at + 8])!r})"
            )
        return after[len(before):]

    def closing(self, action_ids: Sequence[int]) -> list[int]:
        """Tokens that close an assistant message after the model's ``action_ids``."""
        if action_ids and action_ids[-1] == self.end_of_turn_id:
            return list(self.closing_ids[1:])
        return list(self.closing_ids)


@dataclass(frozen=True)
class AgentConfig:
    """Limits of the agent loop.

    Attributes:
        max_turn_tokens: generated tokens per turn (the engine's ``max_tokens``).
        max_episode_tokens: whole-context limit (prompt + all turns), in tokens; an
            episode that would exceed it is truncated with ``truncation="episode_tokens"``.
        max_turns: turns per episode, a safety cap on top of the env's own.
        env_workers: threads stepping envs concurrently.
    """

    max_turn_tokens: int = 384
    max_episode_tokens: int = 2048
    max_turns: int = 8
    env_workers: int = 8

    def __post_init__(self) -> None:
        for name in ("max_turn_tokens", "max_episode_tokens", "max_turns", "env_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class Turn:
    """One completed turn: the policy's action and the env's answer.

    Attributes:
        action_ids / action_logprobs: sampled ids and their sampling logprobs (nats).
        obs_ids: closing + observation-delta ids (loss mask 0).
        snapshot: the env snapshot after this turn (branch point for continuations).
        truncation: ``None``, ``"turn_tokens"`` (the action hit ``max_turn_tokens``) or
            ``"episode_tokens"`` / ``"max_turns"`` (the episode was cut here).
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


@dataclass
class Episode:
    """A live or finished episode; ``branch_of`` links a continuation to its parent."""

    task: Task
    seed: int
    env: Any
    prompt_ids: tuple[int, ...]
    messages: list[Message]
    tools: list | None
    context: tuple[int, ...]
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    branch_of: tuple[int, int] | None = None  # (parent episode uid, turns inherited)
    uid: int = -1
    group: Any = None  # caller's tag (e.g. the tree / node this episode grows)

    @property
    def reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def own_turns(self) -> list[Turn]:
        """Turns this episode generated itself (after the inherited prefix)."""
        return self.turns[self.branch_of[1]:] if self.branch_of else self.turns


class AgentRunner:
    """Runs episodes of one env family with one engine, batched across episodes.

    Args:
        engine: a :class:`~trace_gym.engines.RolloutEngine`.
        tokenizer: the policy's tokenizer (chat template required).
        make_env: zero-argument factory of fresh env instances.
        sampling: base sampling settings; ``max_tokens`` is set per call from the config.
        config: loop limits.
        ledger: where exact costs go (generated / prefill tokens, env steps, seconds
            in the ``generation`` and ``environment`` phases); a fresh one by default.
    """

    def __init__(self, engine: Any, tokenizer: Any, make_env: Callable[[], Any], sampling: SamplingParams,
                 config: AgentConfig = AgentConfig(), ledger: BudgetLedger | None = None):
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.renderer = ChatRenderer(tokenizer)
        self.config = config
        stop_ids = set(sampling.stop_token_ids) | {self.renderer.end_of_turn_id}
        self.sampling = replace(sampling, stop_token_ids=tuple(sorted(stop_ids)))
        self.ledger = ledger if ledger is not None else BudgetLedger()
        self.truncations: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=config.env_workers, thread_name_prefix="env")
        self._uid = 0
        self._calls = 0

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- starting and branching -------------------------------------------------
    def start(self, task: Task, seed: int, group: Any = None) -> Episode:
        """Reset a fresh env to ``task`` and render its first observation."""
        env = self.make_env()
        obs, info = env.reset(seed=seed, options={"task": task})
        tools = info.get("tools")
        prompt = tuple(self.renderer.prompt(obs, tools))
        if len(prompt) >= self.config.max_episode_tokens:
            env.close()
            raise ValueError(f"task {task.id!r}: the prompt has {len(prompt)} tokens, at or over "
                             f"max_episode_tokens={self.config.max_episode_tokens}")
        return Episode(task, seed, env, prompt, list(obs), tools, prompt, uid=self._next_uid(), group=group)

    def branch(self, parent: Episode, turns: int, k: int, group: Any = None) -> list[Episode]:
        """``k`` continuations of ``parent`` after its first ``turns`` turns.

        Each gets a fresh env restored from that turn's snapshot and the parent's token
        context up to there (one shared tuple, so the engine sees one prefix, n=k).
        """
        if not 1 <= turns <= len(parent.turns):
            raise ValueError(f"can branch after turns 1..{len(parent.turns)}, got {turns}")
        snap = parent.turns[turns - 1].snapshot
        if snap is None:
            raise ValueError(f"turn {turns} of episode {parent.uid} has no snapshot")
        if parent.turns[turns - 1].terminated or parent.turns[turns - 1].truncated:
            raise ValueError(f"episode {parent.uid} ended at turn {turns}; nothing to continue")
        kept = parent.turns[:turns]
        context = parent.prompt_ids + tuple(t for turn in kept for t in (*turn.action_ids, *turn.obs_ids))
        messages = list(parent.messages[: self._message_count(parent, turns)])
        children = []
        for _ in range(k):
            env = self.make_env()
            env.reset(seed=parent.seed, options={"task": parent.task})
            env.unwrapped.restore(snap)
            children.append(Episode(parent.task, parent.seed, env, parent.prompt_ids, list(messages), parent.tools,
                                    context, list(kept), branch_of=(parent.uid, turns), uid=self._next_uid(),
                                    group=group))
        return children

    @staticmethod
    def _message_count(ep: Episode, turns: int) -> int:
        first = len(ep.messages) - sum(1 + len(t.obs_messages) for t in ep.turns)
        return first + sum(1 + len(t.obs_messages) for t in ep.turns[:turns])

    # -- the loop -----------------------------------------------------------------
    def run(self, episodes: Sequence[Episode],
            on_finish: Callable[[Episode], Sequence[Episode]] | None = None) -> list[Episode]:
        """Step all episodes to the end; ``on_finish(ep)`` may return new episodes
        (continuations) that join the batch immediately. Returns every finished episode."""
        live = [e for e in episodes if not e.done]
        finished: list[Episode] = [e for e in episodes if e.done]
        try:
            self._run(live, finished, on_finish)
        except BaseException:
            for ep in live:
                ep.env.close()  # never leak an env (a sandboxed kernel) when a step fails
            raise
        return finished

    def _run(self, live: list[Episode], finished: list[Episode],
             on_finish: Callable[[Episode], Sequence[Episode]] | None) -> None:
        while live:
            self._cut_long_episodes(live)
            active = [e for e in live if not e.done]
            if active:
                self._step(active)
            ended = [ep for ep in live if ep.done]
            if ended:  # closing an env can be slow (a sandboxed kernel): in parallel
                with self.ledger.phase("environment"):
                    list(self._pool.map(lambda ep: ep.env.close(), ended))
            still = []
            for ep in live:
                if ep.done:
                    finished.append(ep)
                    if on_finish is not None:
                        still.extend(on_finish(ep))
                else:
                    still.append(ep)
            live[:] = still

    def _cut_long_episodes(self, live: list[Episode]) -> None:
        for ep in live:
            reason = None
            if len(ep.context) + 1 > self.config.max_episode_tokens:
                reason = "episode_tokens"
            elif len(ep.turns) >= self.config.max_turns:
                reason = "max_turns"
            if reason is not None:
                ep.done = True
                self.truncations[reason] = self.truncations.get(reason, 0) + 1
                if ep.turns:
                    ep.turns[-1].truncated = True
                    ep.turns[-1].truncation = reason

    def _step(self, active: list[Episode]) -> None:
        # one prefix per distinct context object: fresh branches share theirs (n = k)
        groups: dict[tuple[int, int], list[Episode]] = {}
        for ep in active:
            budget = min(self.config.max_turn_tokens, self.config.max_episode_tokens - len(ep.context))
            groups.setdefault((id(ep.context), budget), []).append(ep)
        by_budget: dict[int, list[list[Episode]]] = {}
        for (_, budget), eps in groups.items():
            by_budget.setdefault(budget, []).append(eps)
        jobs = []
        for budget, batches in by_budget.items():
            self._calls += 1
            seed = None if self.sampling.seed is None else self.sampling.seed + 7919 * self._calls
            params = replace(self.sampling, max_tokens=budget, seed=seed)
            with self.ledger.phase("generation"):
                outs = self.engine.generate([list(b[0].context) for b in batches], [len(b) for b in batches], params)
            for batch, comps in zip(batches, outs):
                # a prefix is prefilled once per request; the cache may serve part of it
                cached = min((c.cached_tokens or 0) for c in comps) if comps else 0
                self.ledger.add_tokens(generated=sum(len(c.token_ids) for c in comps),
                                       prefill=max(len(batch[0].context) - cached, 0))
                jobs.extend((ep, comp, budget) for ep, comp in zip(batch, comps))
        with self.ledger.phase("environment"):
            results = list(self._pool.map(lambda job: self._env_step(job[0], job[1]), jobs))
        self.ledger.add_env_steps(len(jobs))
        for (ep, comp, _), (text, result, snapshot) in zip(jobs, results):
            self._record(ep, comp, text, result, snapshot)

    def _env_step(self, ep: Episode, comp: Any) -> tuple[str, tuple, Snapshot | None]:
        """The env's part of a turn (runs in the pool): step, then snapshot if it goes on."""
        text = comp.text if comp.text is not None else self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
        result = ep.env.step(text)
        snapshot = None if (result[2] or result[3]) else ep.env.unwrapped.snapshot()
        return text, result, snapshot

    def _record(self, ep: Episode, comp: Any, text: str, result: tuple, snapshot: Snapshot | None) -> None:
        """The harness's part of a turn: template delta, token bookkeeping, the Turn record."""
        obs, reward, terminated, truncated, info = result
        truncation = "turn_tokens" if comp.finish_reason == "length" else None
        ep.messages.append(Message("assistant", text))
        closing = self.renderer.closing(comp.token_ids)
        delta = [] if (terminated or truncated) else self.renderer.observation(ep.messages, obs, ep.tools)
        obs_ids = tuple(closing + delta)
        ep.messages.extend(obs)
        ep.turns.append(Turn(comp.token_ids, comp.logprobs, text, comp.finish_reason, obs_ids, tuple(obs),
                             float(reward), bool(terminated), bool(truncated), info, snapshot, truncation,
                             comp.cached_tokens))
        ep.context = ep.context + tuple(comp.token_ids) + obs_ids
        if truncation:
            self.truncations[truncation] = self.truncations.get(truncation, 0) + 1
        ep.done = bool(terminated or truncated)

    def _next_uid(self) -> int:
        self._uid += 1
        return self._uid


def token_masks(ep: Episode) -> tuple[list[int], list[int], list[float]]:
    """Full token ids, loss mask (1 on policy tokens) and sampling logprobs (0 elsewhere)."""
    ids, mask, logps = list(ep.prompt_ids), [0] * len(ep.prompt_ids), [0.0] * len(ep.prompt_ids)
    for turn in ep.turns:
        ids += [*turn.action_ids, *turn.obs_ids]
        mask += [1] * len(turn.action_ids) + [0] * len(turn.obs_ids)
        logps += [*turn.action_logprobs] + [0.0] * len(turn.obs_ids)
    return ids, mask, logps
