"""Single-turn QA with an exact-match rubric: ``vf.SingleTurnEnv`` over a small dataset,
an ``XMLParser`` for ``<answer>`` tags, and two weighted reward functions (exact match 1.0,
the parser's format reward 0.2)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

QUESTIONS = [("What is 2 + 3?", "5", "arithmetic"), ("What is the capital of France?", "Paris", "geography"),
             ("How many legs has a spider?", "8", "biology"), ("What is 9 times 7?", "63", "arithmetic"),
             ("Which gas do plants take in?", "CO2", "biology")]
SYSTEM_PROMPT = "Answer the question inside <answer>...</answer> tags."


def load_environment(num_examples: int = -1, format_weight: float = 0.2) -> vf.Environment:
    rows = [{"question": q, "answer": a, "info": {"topic": topic}, "task": "exact-qa"}
            for q, a, topic in QUESTIONS[: None if num_examples < 0 else num_examples]]
    parser = vf.XMLParser(["answer"], answer_field="answer")

    def exact_match(completion, answer, parser) -> float:
        return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0

    rubric = vf.Rubric(funcs=[exact_match, parser.get_format_reward_func()], weights=[1.0, format_weight],
                       parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt=SYSTEM_PROMPT, parser=parser,
                            rubric=rubric)
