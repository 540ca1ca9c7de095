"""Running a suite's episodes, and writing them out as transcripts.

:func:`run_episodes` generates through the rollout engine with the agent loop (batched, the
same code as rollouts), with fixed seeds: sample ``j`` of task ``i`` resets its env with
``seed + 1000 i + j`` and the engine draws with ``seed``. Greedy (temperature 0) or
sampled. :func:`episode_transcripts` turns finished episodes into the bench's transcript
records plus the conversation, the extracted answer and the grader's verdict.

The suite table is :mod:`evaluators.suites`; scoring is :mod:`evaluators.scoring`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from evaluators.scoring import episode_verdict
from trace_gym.types import Task, env_seed

if TYPE_CHECKING:
    from evaluators.suite import Suite


def run_episodes(engine: Any, suite: Suite, tasks: Sequence[Task], *, samples: int, temperature: float, seed: int,
                 env_kwargs: Mapping[str, Any] | None = None, max_turns: int | None = None, max_turn_tokens: int | None = None,
                 max_episode_tokens: int | None = None, progress: bool = False, batch_episodes: int = 64) -> list[list[Any]]:
    """Run ``samples`` episodes of every task; returns the finished episodes per task.

    Episodes run ``batch_episodes`` at a time (the engine decodes them as one batch). The
    progress bar counts finished episodes and shows the turns generated so far, updated
    after every generation round (a long suite such as BFCL moves per turn, not per entry).
    """
    import gymnasium
    from tqdm.auto import tqdm

    import trace_gym  # noqa: F401  (registers the env ids)
    from trace_gym.agent.loop import AgentConfig, AgentRunner
    from trace_gym.types import SamplingParams

    if temperature == 0 and samples > 1:
        raise ValueError(f"greedy decoding (temperature 0) gives {samples} identical samples; use samples=1 "
                         "or temperature > 0")
    agent_cfg = AgentConfig(max_turn_tokens=max_turn_tokens or suite.max_turn_tokens,
                            max_episode_tokens=max_episode_tokens or suite.max_episode_tokens,
                            max_turns=max_turns or suite.max_turns)
    sampling = SamplingParams(max_tokens=agent_cfg.max_turn_tokens, temperature=temperature, seed=seed)
    kwargs = {**dict(suite.env_kwargs), **dict(env_kwargs or {})}
    make_env = functools.partial(gymnasium.make, suite.env_id, disable_env_checker=True, **kwargs)
    out: list[list[Any]] = [[] for _ in tasks]
    bar = tqdm(total=len(tasks) * samples, desc=f"eval {suite.name}", unit="episode", disable=not progress,
               leave=False, dynamic_ncols=True)
    runner = AgentRunner(engine, engine.tokenizer, make_env, sampling, agent_cfg)
    per_batch = max(1, batch_episodes // samples)
    turns_before = 0
    try:
        for lo in range(0, len(tasks), per_batch):
            episodes = []
            for i in range(lo, min(lo + per_batch, len(tasks))):  # a task's samples: one request, n = samples
                episodes += runner.start_many([(tasks[i], env_seed(seed, i, j)) for j in range(samples)], anchor=i)
            while runner.live:  # one generation round per advance: the bar moves per turn
                finished = runner.advance()
                for ep in finished:
                    out[ep.anchor].append(ep)
                bar.update(len(finished))
                bar.set_postfix_str(f"turns {turns_before + sum(len(ep.turns) for ep in episodes)}", refresh=True)
            turns_before += sum(len(ep.turns) for ep in episodes)
    finally:
        runner.close()
        bar.close()
    return out


def episode_tree(ep: Any) -> Any:
    """One finished episode as a one-branch :class:`~trace_gym.tree.RolloutTree` (the form
    the bench's transcript writer, :func:`trace_gym.agent.transcripts.transcripts`, reads)."""
    from trace_gym.tree import ROOT, RolloutTree

    tree = RolloutTree(ep.task.id, ep.prompt_ids, text=ep.task.prompt)
    branch, node = tree.start_branch(ROOT), ROOT
    for n, turn in enumerate(ep.turns):
        last = n == len(ep.turns) - 1
        info: dict[str, Any] = {"observation": [m.to_dict() for m in turn.obs_messages]}
        if turn.truncation:
            info["truncation"] = turn.truncation
        if "env_error" in turn.info:
            info["error"] = turn.info["env_error"]
        node = tree.add_turn(node, branch=branch, policy_token_ids=turn.action_ids, observation_token_ids=turn.obs_ids,
                             text=turn.action_text, reward=ep.reward if last else None, terminal=last, info=info)
    return tree


def episode_transcripts(suite: Suite, tasks: Sequence[Task], episodes: Sequence[Sequence[Any]],
                        limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` transcripts, task by task and sample by sample: the bench's record
    (prompt, each turn's action and observation, reward) plus the whole conversation
    (``messages``), the extracted ``answer`` and the grader's ``verdict``."""
    from trace_gym.agent.transcripts import transcripts

    out: list[dict[str, Any]] = []
    for task, eps in zip(tasks, episodes):
        for sample, ep in enumerate(eps):
            if len(out) >= limit:
                return out
            record = (transcripts([episode_tree(ep)], 1) or
                      [{"task_id": task.id, "prompt": task.prompt, "reward": ep.reward, "turns": []}])[0]
            answer, verdict = episode_verdict(suite, task, ep)
            out.append({"suite": suite.name, **record, "sample": sample, "seed": ep.seed,
                        "messages": [m.to_dict() for m in ep.messages], "answer": answer, "verdict": verdict,
                        "error": ep.error})
    return out
