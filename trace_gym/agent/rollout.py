"""Tree rollouts on real episodes: the agent loop as a branch runner of the step driver.

One call to :func:`collect` is the rollout half of a training step: it runs the one
step driver (:func:`trace_gym.step.driver.run_step`) with an :class:`AgentBranchRunner`,
which turns the driver's requests (root rollouts of a prompt, k continuations from a
tree node) into agent episodes (:class:`~trace_gym.agent.loop.AgentRunner`) and appends
every finished episode to its prompt's tree. Every allocation decision (roots, the
per-prompt continuation budget, where continuations go, the single-turn fallback)
is the driver's and :mod:`trace_gym.allocation.planning`'s, the same as in the simulator.

Each call gets its own :class:`~trace_gym.budget.BudgetLedger` (``StepResult.ledger``).
An env that raises ends only its own episode: that episode is a truncated failure leaf
(``info["env_error"]`` on its last node; or no leaf when reset/restore failed), and the
error is in ``StepResult.errors`` and counted in ``ledger.errors``.

The step includes its learning half (the predictor's update on the finished trees,
:func:`trace_gym.step.learning.update_predictor`), as in every other consumer of the driver.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from trace_gym.agent.loop import AgentRunner, Episode
from trace_gym.budget import BudgetLedger
from trace_gym.step.driver import BranchResult, StepResult, run_step
from trace_gym.step.learning import PREFIX_SHARE
from trace_gym.predictor.kinds import Context, SuccessPredictor
from trace_gym.allocation.strategy import Strategy
from trace_gym.tree import ROOT, RolloutTree
from trace_gym.types import Task, env_seed


def history_text(tree: RolloutTree, node_id: int) -> str:
    """The serialised interaction from the prompt down to ``node_id`` (predictor input).

    One line block per turn: ``assistant: <action>`` then the observation messages as
    ``<role>: <content>``. The prompt itself is not included (it is ``Context.prompt``).
    """
    parts = []
    for i in tree.path(node_id)[1:]:
        node = tree.nodes[i]
        parts.append(f"assistant: {node.text}")
        parts.extend(f"{m['role']}: {m['content']}" for m in node.info.get("observation", ()))
    return "\n".join(parts)


def node_context(tree: RolloutTree, node_id: int, prompt: str) -> Context:
    """The predictor's :class:`Context` for one anchor of ``tree``."""
    return Context(prompt, history_text(tree, node_id), tree.nodes[node_id].depth)


class AgentBranchRunner:
    """The :class:`~trace_gym.step.driver.BranchRunner` of real rollouts (one per step).

    Root rollout j of the tree keyed ``i`` resets its env with seed
    ``seed + 1000 i + j`` (j counts on through fallback roots). Episodes carry the
    explicit anchor ``(i, node id)``, so continuations from one node are generated as
    one request with ``n = k``.

    Attributes:
        truncations: count per truncation reason over this runner's episodes.
    """

    def __init__(self, agent: AgentRunner, seed: int = 0):
        self.agent = agent
        self.seed = seed
        self.truncations: dict[str, int] = {}
        self._tasks: dict[Hashable, Task] = {}
        self._trees: dict[Hashable, RolloutTree] = {}
        self._roots_started: dict[Hashable, int] = {}
        self._origin: dict[tuple[Hashable, int], tuple[Episode, int]] = {}  # node -> (episode, turns up to it)
        self._live: set[int] = set()

    @property
    def single_turn(self) -> bool:
        """No episode can outlive its first turn: the agent loop's ``max_turns`` is 1, or
        the env class declares ``single_turn = True`` (see ``BranchRunner``)."""
        from trace_gym.env.contract import env_class

        cls = env_class(self.agent.make_env)
        return self.agent.config.max_turns == 1 or bool(getattr(cls, "single_turn", False))

    @property
    def difficulty_knobs(self) -> dict[str, str]:
        """The env's own difficulty knobs (:func:`trace_gym.env.contract.env_difficulty_knobs`), for the
        no-contrast warning."""
        from trace_gym.env.contract import env_difficulty_knobs

        return env_difficulty_knobs(self.agent.make_env)

    def prompt_context(self, candidate: Task) -> Context:
        return Context(candidate.prompt)

    def node_context(self, key: Hashable, node_id: int) -> Context:
        return node_context(self._trees[key], node_id, self._tasks[key].prompt)

    def new_tree(self, key: Hashable, candidate: Task) -> RolloutTree:
        self._tasks[key] = candidate
        self._trees[key] = RolloutTree(candidate.id, text=candidate.prompt)
        self._roots_started[key] = 0
        return self._trees[key]

    def start_roots(self, key: int, count: int, ledger: BudgetLedger) -> None:
        j0 = self._roots_started[key]
        self._roots_started[key] += count
        jobs = [(self._tasks[key], env_seed(self.seed, key, j0 + j)) for j in range(count)]
        self._track(self.agent.start_many(jobs, anchor=(key, ROOT), ledger=ledger))

    def start_continuations(self, key: Hashable, node_id: int, count: int, ledger: BudgetLedger) -> None:
        episode, turns = self._origin[(key, node_id)]
        self._track(self.agent.branch(episode, turns, count, anchor=(key, node_id), ledger=ledger))

    def _track(self, episodes: list[Episode]) -> None:
        self._live.update(ep.uid for ep in episodes)

    @property
    def live(self) -> int:
        return len(self._live)

    def advance(self, ledger: BudgetLedger) -> list[BranchResult]:
        out = []
        for ep in self.agent.advance():
            if ep.uid not in self._live:
                continue  # not this step's (the agent runner was shared)
            self._live.discard(ep.uid)
            key, anchor = ep.anchor
            for turn in ep.own_turns:
                if turn.truncation:
                    self.truncations[turn.truncation] = self.truncations.get(turn.truncation, 0) + 1
            leaf = self._append(key, ep, anchor) if ep.own_turns else None
            out.append(BranchResult(key, anchor, leaf, ep.error))
        return out

    def cancel(self) -> None:
        self.agent.cancel()
        self._live.clear()

    def _append(self, key: Hashable, ep: Episode, anchor: int) -> int:
        """Append the episode's own turns below ``anchor``; returns its leaf."""
        tree = self._trees[key]
        if not tree.root.observation_token_ids:
            tree.root.observation_token_ids = ep.prompt_ids
        branch = tree.start_branch(anchor)
        node = anchor
        inherited = len(ep.turns) - len(ep.own_turns)
        own = ep.own_turns
        for n, turn in enumerate(own):
            last = n == len(own) - 1
            info: dict[str, Any] = {"observation": [m.to_dict() for m in turn.obs_messages],
                                    "finish_reason": turn.finish_reason}
            if turn.truncation:
                info["truncation"] = turn.truncation
            if turn.cached_tokens is not None:
                info["cached_tokens"] = turn.cached_tokens
            if "env_error" in turn.info:
                info["env_error"] = turn.info["env_error"]
            node = tree.add_turn(
                node, branch=branch, policy_token_ids=turn.action_ids, observation_token_ids=turn.obs_ids,
                logprobs=turn.action_logprobs, text=turn.action_text, snapshot=turn.snapshot,
                reward=ep.reward if last else None, terminal=last, info=info,
            )
            self._origin[(key, node)] = (ep, inherited + n + 1)
        return node


def collect(
    tasks: Sequence[Task],
    strategy: Strategy,
    predictor: SuccessPredictor,
    runner: AgentRunner,
    nominal_budget: float,
    rng: np.random.Generator,
    *,
    seed: int = 0,
    learn: bool = True,
    prefix_share: float = PREFIX_SHARE,
    fallback_first: bool = False,
    **play: Any,
) -> StepResult:
    """One step of real rollouts (:func:`trace_gym.step.driver.run_step` with an
    :class:`AgentBranchRunner`): rollout trees at ``nominal_budget`` trajectory-equivalents,
    then (``learn``) the predictor's update on them.

    Args:
        tasks: candidate pool.
        strategy: a :class:`~trace_gym.allocation.strategy.Strategy`.
        predictor: scores prompts (``Context(prompt)``) and prefixes (:func:`node_context`).
        runner: the agent loop (engine + env factory). It keeps no ledger of this call.
        nominal_budget: B; the strategy spends M roots + C continuations with
            M + C / 2 <= B.
        rng: randomness for stochastic allocators.
        seed: base env seed; root rollout j of candidate i resets with
            ``seed + 1000 * i + j`` (:func:`trace_gym.types.env_seed`).
        learn, prefix_share, fallback_first: as :func:`trace_gym.step.driver.run_step`.
        play: ``history``, ``step_index``, ``boundary`` for :func:`~trace_gym.step.driver.run_step`
            (:meth:`trace_gym.step.strategy_boundary.StrategyPlay.kwargs`).

    Returns:
        The driver's :class:`~trace_gym.step.driver.StepResult`; each error also names its
        ``task_id``, and ``extras`` holds ``tasks`` (the pool) and ``truncations`` (count per
        truncation reason: ``turn_tokens``, ``episode_tokens``, ``max_turns``, ``env_error``).
    """
    tasks = list(tasks)
    branches = AgentBranchRunner(runner, seed)
    step = run_step(tasks, strategy, predictor, branches, nominal_budget, rng, learn=learn, prefix_share=prefix_share,
                    fallback_first=fallback_first, **play)
    for error in step.errors:
        error["task_id"] = tasks[error["candidate"]].id
    step.extras.update(tasks=tasks, truncations=dict(branches.truncations))
    return step
