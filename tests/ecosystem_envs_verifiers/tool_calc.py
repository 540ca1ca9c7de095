"""A ``vf.ToolEnv``: the model may call ``multiply(a, b)`` (tool calls in hermes
``<tool_call>`` blocks, read by the adapter) before it answers in ``<answer>`` tags; the
rollout stops at the first reply without a tool call. Reward: 1.0 for the right product."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

PAIRS = [(12, 34), (7, 91), (23, 45)]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


def load_environment(max_turns: int = 4) -> vf.Environment:
    rows = [{"question": f"What is {a} * {b}? Use the multiply tool, then answer in <answer></answer>.",
             "answer": str(a * b)} for a, b in PAIRS]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def correct(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    return vf.ToolEnv(dataset=Dataset.from_list(rows), tools=[multiply], max_turns=max_turns, parser=parser,
                      rubric=vf.Rubric(funcs=[correct], parser=parser))
