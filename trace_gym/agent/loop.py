"""The token-in-token-out agent loop.

An episode's history is carried as token ids and never re-tokenised: the policy's
sampled ids are kept as generated, and each observation contributes only the chat
template's *delta* for the new messages. :class:`~trace_gym.agent.chat.ChatRenderer` computes
that delta and fails loudly (:class:`~trace_gym.agent.chat.TemplateError`) when the template is
not append-only for a turn (for example templates that rewrite earlier assistant turns).

Token layout of one turn (``mask`` is the loss mask)::

    [action ids (mask 1)] [closing ids (mask 0)] [observation delta ids (mask 0)]

``closing ids`` are the template tokens after an assistant message's content that
the model did not generate: the end-of-turn token when generation stopped for another
reason (a stop string, the token limit), plus the template's glue after it (``"\\n"``
for ChatML).

:class:`AgentRunner` advances many episodes at once, each on its own: every
:meth:`AgentRunner.advance` makes one batched ``engine.generate`` call for the episodes
that are ready (fresh branches with the same explicit ``anchor`` and the same context
go in as one prefix with ``n = k``), and hands each action to its env as a future in a
thread pool. Env steps still running when the next round starts (a 10 s cell timeout)
do not hold it up: the round waits at most ``AgentConfig.straggler_seconds`` for them,
and a late step's episode joins a later round (in deterministic mode it waits for every
one: rounds that depend on timing would make batches, and so samples, depend on it). An
env that raises (in reset, restore, step, snapshot or close) ends only its own episode, as
truncated with the error recorded; every env is closed, on every path. Env work runs only on the pool's threads,
where no signal is ever delivered, so any ``BaseException`` there (``SystemExit`` or a
``KeyboardInterrupt`` raised by env code) is the env's and ends its episode; a real Ctrl-C
reaches the main thread and stops the run. The runner decides nothing about what
to run: the step driver (:mod:`trace_gym.step.driver`) starts episodes and branches, and
gets back the finished ones.

The records it produces, :class:`~trace_gym.agent.episode.Turn` and
:class:`~trace_gym.agent.episode.Episode`, are plain data in :mod:`trace_gym.agent.episode`
(re-exported here).
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any, Hashable, Sequence

from trace_gym.utils import determinism
from trace_gym.budget import BudgetLedger
from trace_gym.agent.chat import ChatRenderer
from trace_gym.env.contract import EnvFactory, ReplayCost, Snapshot, env_stop_strings
from trace_gym.env.boundary import error_text
from trace_gym.agent.episode import Episode, Turn
from trace_gym.types import Completion, Message, SamplingParams, Task

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """Limits of the agent loop.

    Attributes:
        max_turn_tokens: generated tokens per turn (the engine's ``max_tokens``).
        max_episode_tokens: whole-context limit (prompt + all turns), in tokens; an
            episode that would exceed it is truncated with ``truncation="episode_tokens"``.
        max_turns: turns per episode, a safety cap on top of the env's own.
        env_workers: threads running env work (reset, restore, step, snapshot, close).
        straggler_seconds: how long a generation round waits for env steps started in
            the previous round; a step still running then (a long tool call, a cell
            timeout) no longer holds up the others, and its episode joins a later round.
            ``math.inf``: every round waits for every env step, so the rounds (which
            episodes share a batch, and so their sampling seeds) do not depend on how fast
            an env step ran; a runner built in deterministic mode
            (:mod:`trace_gym.utils.determinism`) always uses it.
    """

    max_turn_tokens: int = 384
    max_episode_tokens: int = 2048
    max_turns: int = 8
    env_workers: int = 8
    straggler_seconds: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_turn_tokens", "max_episode_tokens", "max_turns", "env_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not self.straggler_seconds >= 0:
            raise ValueError(f"AgentConfig.straggler_seconds must be >= 0, got {self.straggler_seconds!r}")


def _describe(exc: BaseException, where: str) -> str:
    name, _, message = error_text(exc).partition(": ")  # cleaned and cut; a raising __str__ is survived
    return f"{name} in env.{where}: {message}"


class AgentRunner:
    """Runs episodes of one env family with one engine, each advancing on its own.

    Use: ``start`` / ``branch`` episodes, then call ``advance()`` until ``live`` is 0;
    each call returns the episodes that finished (env closed). ``run`` does that loop.

    Seconds recorded per episode ledger: ``generation`` (wall-clock of the engine
    calls), ``environment`` (wall-clock the calling thread spent blocked on env work:
    waiting for steps, parallel resets/restores) and ``environment_busy`` (the env
    work's own duration summed over the pool's threads; more than ``environment``
    when env work ran while the engine generated).

    Args:
        engine: a :class:`~trace_gym.engines.RolloutEngine`.
        tokenizer: the policy's tokenizer (chat template required).
        make_env: zero-argument factory of fresh env instances.
        sampling: base sampling settings; ``max_tokens`` is set per call from the config,
            and the env's :class:`~trace_gym.env.contract.StopStrings` join ``stop``.
        config: loop limits.

    Attributes:
        ledger: the default ledger of episodes started without one (direct use);
            :func:`trace_gym.agent.rollout.collect` gives every call its own.
        truncations: count per truncation reason over the runner's life.
    """

    def __init__(self, engine: Any, tokenizer: Any, make_env: EnvFactory, sampling: SamplingParams,
                 config: AgentConfig = AgentConfig()):
        self.engine, self.tokenizer, self.make_env = engine, tokenizer, make_env
        self.renderer = ChatRenderer(tokenizer)
        if determinism.active() is not None:  # rounds independent of the env steps' timing
            config = replace(config, straggler_seconds=math.inf)
        self.config = config
        stop_ids = set(sampling.stop_token_ids) | {self.renderer.end_of_turn_id}
        stops = tuple(dict.fromkeys((*sampling.stop, *env_stop_strings(make_env))))  # the env's closing tags
        self.sampling = replace(sampling, stop=stops, stop_token_ids=tuple(sorted(stop_ids)))
        self.ledger = BudgetLedger()
        self.truncations: dict[str, int] = {}
        self._pool = ThreadPoolExecutor(max_workers=config.env_workers, thread_name_prefix="env")
        self._uid = 0
        self._calls = 0
        self._live: dict[int, Episode] = {}  # uid -> started, not yet returned
        self._ready: list[Episode] = []  # waiting for generation
        self._inflight: dict[Future, tuple[str, Episode, Any]] = {}  # env work in the pool
        self._stragglers: set[Future] = set()
        self._finished: list[Episode] = []  # env closed, to return

    @property
    def live(self) -> int:
        """Episodes started and not yet returned by :meth:`advance`."""
        return len(self._live)

    def close(self) -> None:
        """End every live episode (closing its env) and stop the env threads."""
        self.cancel()
        self._pool.shutdown(wait=True)

    # -- starting and branching -------------------------------------------------
    def start(self, task: Task, seed: int, *, anchor: Hashable = None, ledger: BudgetLedger | None = None) -> Episode:
        """Reset a fresh env to ``task`` and render its first observation."""
        return self.start_many([(task, seed)], anchor=anchor, ledger=ledger)[0]

    def start_many(self, jobs: Sequence[tuple[Task, int]], *, anchor: Hashable = None,
                   ledger: BudgetLedger | None = None) -> list[Episode]:
        """Episodes for ``(task, seed)`` pairs; the env resets run in parallel.

        An env that fails to reset, or a prompt at or over ``max_episode_tokens``, gives
        an episode that is already done with ``error`` set (it comes back from the next
        :meth:`advance`); the others go on.
        """
        ledger = self.ledger if ledger is None else ledger
        opened = self._open([(task, seed, None) for task, seed in jobs], ledger)
        episodes = []
        for (task, seed), (env, obs, info, error) in zip(jobs, opened):
            ep = Episode(task, seed, env, (), [], None, (), uid=self._next_uid(), anchor=anchor, ledger=ledger)
            if error is None:
                ep.tools = info.get("tools")
                ep.messages = list(obs)
                ep.prompt_ids = ep.context = tuple(self.renderer.prompt(obs, ep.tools))
                if len(ep.prompt_ids) >= self.config.max_episode_tokens:
                    error = (f"task {task.id!r}: the prompt has {len(ep.prompt_ids)} tokens, at or over "
                             f"max_episode_tokens={self.config.max_episode_tokens}")
            self._admit(ep, error)
            episodes.append(ep)
        return episodes

    def branch(self, parent: Episode, turns: int, k: int, *, anchor: Hashable = None,
               ledger: BudgetLedger | None = None) -> list[Episode]:
        """``k`` continuations of ``parent`` after its first ``turns`` turns.

        Each gets a fresh env restored from that turn's snapshot (in parallel) and the
        parent's token context up to there. A restore that raises gives a child that is
        already done with ``error`` set.
        """
        if not 1 <= turns <= len(parent.turns):
            raise ValueError(f"can branch after turns 1..{len(parent.turns)}, got {turns}")
        snap = parent.turns[turns - 1].snapshot
        if snap is None:
            raise ValueError(f"turn {turns} of episode {parent.uid} has no snapshot")
        if parent.turns[turns - 1].terminated or parent.turns[turns - 1].truncated:
            raise ValueError(f"episode {parent.uid} ended at turn {turns}; nothing to continue")
        ledger = parent.ledger if ledger is None else ledger
        kept = parent.turns[:turns]
        context = parent.prompt_ids + tuple(t for turn in kept for t in (*turn.action_ids, *turn.obs_ids))
        messages = parent.messages[: self._message_count(parent, turns)]
        children = []
        for env, _, _, error in self._open([(parent.task, parent.seed, snap)] * k, ledger):
            child = Episode(parent.task, parent.seed, env, parent.prompt_ids, list(messages), parent.tools, context,
                            list(kept), branch_of=(parent.uid, turns), uid=self._next_uid(), anchor=anchor,
                            ledger=ledger)
            self._admit(child, error)
            children.append(child)
        return children

    @staticmethod
    def _message_count(ep: Episode, turns: int) -> int:
        first = len(ep.messages) - sum(1 + len(t.obs_messages) for t in ep.turns)
        return first + sum(1 + len(t.obs_messages) for t in ep.turns[:turns])

    def _open(self, jobs: list[tuple[Task, int, Snapshot | None]], ledger: BudgetLedger) -> list[tuple]:
        """Fresh envs reset (and restored) in the pool: ``(env, obs, info, error)`` each."""
        t0 = time.perf_counter()
        out = list(self._pool.map(lambda job: self._open_env(*job), jobs))
        ledger.add_seconds("environment", time.perf_counter() - t0)
        for (env, _, _, error, _), (_, _, snapshot) in zip(out, jobs):
            if snapshot is not None and error is None and isinstance(env.unwrapped, ReplayCost):
                ledger.add_replayed_env_steps(int(env.unwrapped.replay_steps(snapshot)))
        ledger.add_seconds("environment_busy", sum(seconds for *_, seconds in out))
        return [row[:4] for row in out]

    def _open_env(self, task: Task, seed: int, snapshot: Snapshot | None) -> tuple:
        t0, env, where = time.perf_counter(), None, "make"
        try:
            env = self.make_env()
            where = "reset"
            obs, info = env.reset(seed=seed, options={"task": task})
            if snapshot is not None:
                where = "restore"
                env.unwrapped.restore(snapshot)
            return env, obs, info, None, time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001  (a pool thread: the env's own, see the module docstring)
            return env, None, None, _describe(exc, where), time.perf_counter() - t0

    def _admit(self, ep: Episode, error: str | None) -> None:
        self._live[ep.uid] = ep
        if error is None:
            self._ready.append(ep)
        else:
            ep.error = error
            ep.ledger.add_errors(1)
            self._end(ep)

    # -- the loop -----------------------------------------------------------------
    def run(self, episodes: Sequence[Episode] = ()) -> list[Episode]:
        """Advance every live episode to its end; returns them in finishing order."""
        for ep in episodes:
            if self._live.get(ep.uid) is not ep:
                raise ValueError(f"episode {ep.uid} is not live in this runner (start or branch it here)")
        finished: list[Episode] = []
        try:
            while self._live:
                finished.extend(self.advance())
        except BaseException:
            self.cancel()
            raise
        return finished

    def advance(self) -> list[Episode]:
        """One round: take in finished env work, then one batched generation for every
        episode that is ready, whose actions go to their envs (in the pool).

        Waits for the env work of the previous round, so that it joins this round's
        batch, at most ``straggler_seconds``; work still running then is a straggler that
        no later round waits for, unless nothing else is ready (then until the first
        piece of env work returns). Returns the episodes that finished, envs closed.

        Episodes that end in this round are closed (bounded by ``straggler_seconds`` too)
        and returned *before* the round generates: the caller may start work that depends
        on them (a prompt's continuations, once its roots are back) in time for the next
        generation, instead of one whole generation later. Such a call generates nothing;
        the next one does.
        """
        self._take_env_results()
        self._cut_long_episodes()
        if any(kind == "close" and f not in self._stragglers for f, (kind, _, _) in self._inflight.items()):
            self._take_env_results()  # the closes of episodes that just ended
        if self._ready and not self._finished:
            self._cut_long_episodes()  # a step the second take collected may have reached a limit
            self._generate()
        if not self._ready and self._inflight and all(kind == "close" for kind, _, _ in self._inflight.values()):
            self._take_env_results()  # only closes left: finish them now
        out, self._finished = self._finished, []
        for ep in out:
            del self._live[ep.uid]
        return out

    def cancel(self) -> None:
        """End every live episode now: wait for its env work, close its env, forget it."""
        wait(list(self._inflight))
        for f, (kind, ep, _) in self._inflight.items():
            if kind == "close":
                self._closed(ep, *f.result())
        self._inflight.clear()
        self._stragglers.clear()
        open_envs = [ep for ep in self._live.values() if ep.env is not None and not ep.env_closed]
        for ep, result in zip(open_envs, self._pool.map(self._close_env, open_envs)):
            ep.done = True
            self._closed(ep, *result)
        self._live.clear()
        self._ready.clear()
        self._finished.clear()

    def _take_env_results(self) -> None:
        if not self._inflight:
            return
        t0 = time.perf_counter()
        fresh = [f for f in self._inflight if f not in self._stragglers]
        if fresh:
            limit = self.config.straggler_seconds
            _, late = wait(fresh, timeout=None if math.isinf(limit) else limit)
            self._stragglers.update(late)
        if not self._ready and not self._finished and not any(f.done() for f in self._inflight):
            wait(list(self._inflight), return_when=FIRST_COMPLETED)
        waited = time.perf_counter() - t0
        for led in {id(ep.ledger): ep.ledger for _, ep, _ in self._inflight.values()}.values():
            led.add_seconds("environment", waited)
        for f in [f for f in self._inflight if f.done()]:  # in submission order
            kind, ep, payload = self._inflight.pop(f)
            self._stragglers.discard(f)
            if kind == "step":
                self._record(ep, payload, *f.result())
            else:
                self._closed(ep, *f.result())
                self._finished.append(ep)

    def _cut_long_episodes(self) -> None:
        keep = []
        for ep in self._ready:
            reason = None
            if len(ep.context) + 1 > self.config.max_episode_tokens:
                reason = "episode_tokens"
            elif len(ep.turns) >= self.config.max_turns:
                reason = "max_turns"
            if reason is None:
                keep.append(ep)
                continue
            self.truncations[reason] = self.truncations.get(reason, 0) + 1
            if ep.own_turns:
                ep.turns[-1].truncated = True
                ep.turns[-1].truncation = reason
            else:  # a continuation already at the limit: nothing of its own to record
                ep.error = f"cut by {reason} before its first turn ({len(ep.context)} context tokens)"
                ep.ledger.add_errors(1)
            self._end(ep)
        self._ready = keep

    def _generate(self) -> None:
        # fresh episodes with one anchor and one context share a request (n = k)
        requests: dict[tuple, list[list[Episode]]] = {}
        for ep in self._ready:
            budget = min(self.config.max_turn_tokens, self.config.max_episode_tokens - len(ep.context))
            key = (budget, ep.anchor) if ep.anchor is not None and not ep.own_turns else (budget, "uid", ep.uid)
            same = requests.setdefault(key, [])
            for group in same:
                if group[0].context == ep.context:
                    group.append(ep)
                    break
            else:
                same.append([ep])
        self._ready = []
        by_budget: dict[int, list[list[Episode]]] = {}
        for (budget, *_), groups in requests.items():
            by_budget.setdefault(budget, []).extend(groups)
        for budget, groups in by_budget.items():
            self._calls += 1
            seed = None if self.sampling.seed is None else self.sampling.seed + 7919 * self._calls
            params = replace(self.sampling, max_tokens=budget, seed=seed)
            t0 = time.perf_counter()
            outs = self.engine.generate([list(g[0].context) for g in groups], [len(g) for g in groups], params)
            seconds = time.perf_counter() - t0
            n_total = sum(len(g) for g in groups)
            for group, comps in zip(groups, outs):
                led = group[0].ledger
                led.add_seconds("generation", seconds * len(group) / n_total)
                # a prefix is prefilled once per request; the cache may serve part of it
                cached = min((c.cached_tokens or 0) for c in comps) if comps else 0
                led.add_tokens(generated=sum(len(c.token_ids) for c in comps),
                               prefill=max(len(group[0].context) - cached, 0))
                for ep, comp in zip(group, comps):
                    text = comp.text if comp.text is not None else self.tokenizer.decode(
                        comp.token_ids, skip_special_tokens=True)
                    self._inflight[self._pool.submit(self._env_step, ep, text)] = ("step", ep, (comp, text))

    @staticmethod
    def _env_step(ep: Episode, text: str) -> tuple:
        """The env's part of a turn (runs in the pool): step, then snapshot if it goes on.

        Returns ``(result, snapshot, error, seconds)``; never raises.
        """
        t0, where = time.perf_counter(), "step"
        try:
            result = ep.env.step(text)
            snapshot = None
            if not (result[2] or result[3]):
                where = "snapshot"
                snapshot = ep.env.unwrapped.snapshot()
            return result, snapshot, None, time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001  (a pool thread: the env's own, see the module docstring)
            return None, None, _describe(exc, where), time.perf_counter() - t0

    def _record(self, ep: Episode, payload: tuple[Completion, str], result: tuple | None,
                snapshot: Snapshot | None, error: str | None, seconds: float) -> None:
        """The harness's part of a turn: template delta, token bookkeeping, the Turn record."""
        comp, text = payload
        ep.ledger.add_seconds("environment_busy", seconds)
        ep.ledger.add_env_steps(1)
        ep.messages.append(Message("assistant", text))
        closing = self.renderer.closing(comp.token_ids)
        if error is not None:  # the env raised on this action: the episode ends here, truncated
            obs, reward, terminated, truncated, info = [], 0.0, False, True, {"env_error": error}
            truncation = "env_error"
            ep.error = error
            ep.ledger.add_errors(1)
        else:
            obs, reward, terminated, truncated, info = result
            truncation = "turn_tokens" if comp.finish_reason == "length" else None
        delta = [] if (terminated or truncated) else self.renderer.observation(ep.messages, obs, ep.tools)
        obs_ids = tuple(closing + delta)
        ep.messages.extend(obs)
        ep.turns.append(Turn(comp.token_ids, comp.logprobs, text, comp.finish_reason, obs_ids, tuple(obs),
                             float(reward), bool(terminated), bool(truncated), info, snapshot, truncation,
                             comp.cached_tokens))
        ep.context = ep.context + tuple(comp.token_ids) + obs_ids
        if truncation:
            self.truncations[truncation] = self.truncations.get(truncation, 0) + 1
        if terminated or truncated:
            self._end(ep)
        else:
            self._ready.append(ep)

    def _end(self, ep: Episode) -> None:
        """The episode is over: close its env in the pool; it is returned once closed."""
        ep.done = True
        self._inflight[self._pool.submit(self._close_env, ep)] = ("close", ep, None)

    @staticmethod
    def _close_env(ep: Episode) -> tuple[float, str | None]:
        """Close the episode's env once (runs in the pool): ``(seconds, error)``; never raises."""
        if ep.env is None or ep.env_closed:
            return 0.0, None
        ep.env_closed = True
        t0 = time.perf_counter()
        try:
            ep.env.close()
            return time.perf_counter() - t0, None
        except BaseException as exc:  # noqa: BLE001  (a pool thread: recorded on the episode and in its ledger)
            return time.perf_counter() - t0, _describe(exc, "close")

    @staticmethod
    def _closed(ep: Episode, seconds: float, error: str | None) -> None:
        ep.ledger.add_seconds("environment_busy", seconds)
        if error is not None:
            _log.warning("episode %d: %s", ep.uid, error)
            ep.error = ep.error or error
            ep.ledger.add_errors(1)

    def _next_uid(self) -> int:
        self._uid += 1
        return self._uid
