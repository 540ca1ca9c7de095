"""Hostile outputs through ``AgentRunner`` (issue 11): a scripted policy answers every turn
with a case of the hostile corpus; every episode finishes, every observation becomes
token ids through SmolLM2's real chat template, and no batch is aborted.

The policy is scripted (the point is *which* text reaches the envs); the tokenizer,
the chat template, the runner and the envs are the real ones.
"""

from __future__ import annotations

import pytest
from hostile_corpus import BFCL_PYTHON, MATH_CODE, MATH_RESPONSES

from environments.math_python.env import MathPythonEnv
from environments.math_python.sandbox import KernelLimits
from trace_gym.agent.loop import AgentConfig, AgentRunner
from trace_gym.types import Completion, SamplingParams, Task


class ScriptedPolicy:
    """Answers an episode's ``t``-th turn with ``script[t]``. ``t`` is read from the prefix: one
    more than the turn of the longest earlier prefix it extends (an episode's context only
    grows). Episodes whose env steps end at different times are asked in separate generate
    calls, so a count of calls would hand one episode another's turn; and the prefix's text
    cannot be counted, since an attack prints the chat template's own tokens."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script = tokenizer, script
        self.weights_version = 0
        self._turns: dict[tuple, int] = {}

    def _turn(self, prefix) -> int:
        prefix = tuple(prefix)
        if prefix not in self._turns:
            earlier = [t for q, t in self._turns.items() if len(q) < len(prefix) and prefix[: len(q)] == q]
            self._turns[prefix] = max(earlier, default=-1) + 1
        return self._turns[prefix]

    def _completion(self, prefix, sampling) -> Completion:
        text = self.script[min(self._turn(prefix), len(self.script) - 1)]
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # what a tokenizer can emit
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: sampling.max_tokens - 1]
        ids.append(self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token))
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(tuple(ids), (0.0,) * len(ids), "stop", text=text)

    def generate(self, prefixes, n, sampling):
        return [[self._completion(prefix, sampling)] * k for prefix, k in zip(prefixes, n)]

    def close(self):
        pass


def _cells(*sources: str) -> str:
    return "\n".join(f"```python\n{s}\n```" for s in sources)


def _run(tokenizer, make_env, task, script, episodes=2, max_episode_tokens=8192):
    runner = AgentRunner(ScriptedPolicy(tokenizer, script), tokenizer, make_env, SamplingParams(temperature=0.0),
                         AgentConfig(max_turn_tokens=2048, max_episode_tokens=max_episode_tokens,
                                     max_turns=len(script), env_workers=4))
    try:
        started = [runner.start(task, seed=s) for s in range(episodes)]
        finished = runner.run(started)
    finally:
        runner.close()
    assert len(finished) == episodes
    for ep in finished:
        assert ep.done and ep.turns
        for turn in ep.turns:
            for m in turn.obs_messages:
                m.content.encode("utf-8")
            if not (turn.terminated or turn.truncated):
                assert turn.obs_ids  # the observation went through the chat template
    return finished


def test_math_hostile_script_through_the_runner(tokenizer):
    # background_exit's thread kills the interpreter 50 ms after its cell; a sleeping cell between
    # makes that death land in the sleep (not in print(6 * 7), which would lose its output under load).
    between = {"background_exit": ["import time\ntime.sleep(2)"]}
    attacks = ("lone_surrogate_exception", "forged_frames", "fork_bomb", "close_all_fds", "background_exit",
               "invalid_utf8_bytes", "chat_template_tokens", "huge_traceback", "import_project")
    script = [_cells(MATH_CODE[k], *between.get(k, []), "print(6 * 7)") for k in attacks]
    script += [MATH_RESPONSES["four_hundred_kb"][:20000], MATH_RESPONSES["final_surrogate"]]
    limits = KernelLimits(cell_timeout_s=6.0, memory_mb=512, output_bytes=2048)  # generous: CI machines are shared
    task = Task(id="agent-hostile", prompt="What is 2 + 3?", answer="5")
    finished = _run(tokenizer, lambda: MathPythonEnv([task], limits=limits, max_turns=50, prestart_kernel=False),
                    task, script)
    for ep in finished:
        assert ep.turns[-1].terminated
        for attack, turn in zip(attacks, ep.turns):  # the cell after each attack ran
            assert "42" in turn.obs_messages[0].content, (attack, turn.obs_messages[0].content[-600:])


def test_bfcl_hostile_script_through_the_runner(tokenizer):
    pytest.importorskip("bfcl_eval")
    from environments.bfcl.data import load_task
    from environments.bfcl.env import BFCLEnv

    script = [BFCL_PYTHON[k] for k in ("surrogate_echo", "deep_parens", "many_big_args", "surrogate_escape",
                                       "chat_tokens_in_arg", "int_division_huge")]
    script += [BFCL_PYTHON["arith_chain_2000"], "[pwd()]", "Done."] * 3
    _run(tokenizer, lambda: BFCLEnv(), load_task("multi_turn_base_0"), script, max_episode_tokens=32768)
