"""`trace-gym eval`'s BFCL suite: the per-category table from episodes run through the agent loop,
and bfcl-eval's own pipeline (its decoders and ``multi_turn_checker``, see test_bfcl_agreement.py)
giving identical verdicts and numbers on the same model outputs.

The policy is scripted (a RolloutEngine that answers each entry from a script: the ground truth
for some entries, a broken run for others), so that both verdicts occur; the agent loop, the
env, the backends and both checkers are the real ones.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tenacity")

from environments.bfcl import data  # noqa: E402
from environments.bfcl.env import END_TURN, BFCLEnv  # noqa: E402
from evaluators.suites import SUITES, run_episodes, score_episodes  # noqa: E402
from test_bfcl_agreement import Official  # noqa: E402
from trace_gym.types import Completion  # noqa: E402


class ScriptedEngine:
    """Answers each entry's turns from a script, found by the entry's first question in the prefix."""

    def __init__(self, tokenizer, scripts: dict[str, list[str]]):
        self.tokenizer, self.scripts = tokenizer, scripts
        self.calls: dict[str, int] = defaultdict(int)
        self.weights_version = 0

    def generate(self, prefixes, n, sampling):
        out = []
        for prefix, k in zip(prefixes, n):
            text = self.tokenizer.decode(list(prefix))
            (key,) = [q for q in self.scripts if q in text]
            replies = []
            for _ in range(k):
                script = self.scripts[key]
                reply = script[self.calls[key]] if self.calls[key] < len(script) else END_TURN
                self.calls[key] += 1
                ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                replies.append(Completion(ids, [0.0] * len(ids), "stop", text=reply))
            out.append(replies)
        return out

    def score(self, sequences, start=1):
        raise NotImplementedError("a scripted policy has no log-probabilities")

    def update_weights(self, named_tensors, version):
        self.weights_version = version

    def reset_prefix_cache(self):
        pass

    def close(self):
        pass


def broken(actions: list[str]) -> list[str]:
    """The ground truth with its first call dropped (the turn structure is kept)."""
    first = next(i for i, a in enumerate(actions) if a != END_TURN)
    return actions[:first] + actions[first + 1:]


def test_bfcl_eval_per_category_table_agrees_with_bfcl_eval(smollm2_path):  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    suite = SUITES["bfcl"]
    official = Official()
    tasks, episodes, actions = [], [], {}
    for category in data.CATEGORIES:  # one category at a time: entries of one scenario share questions
        env = BFCLEnv(category=category)
        mine = data.load_tasks(category, "eval")[:3]
        scripts = {}
        for i, task in enumerate(mine):
            gt = env.reference_actions(task)
            script = gt if i != 1 else broken(gt)
            if i == 2:
                script = ["I cannot help with that."] * len(gt)
            scripts[data.get_entry(task.id)["question"][0][0]["content"]] = script
        env.close()
        eps = run_episodes(ScriptedEngine(tokenizer, scripts), suite, mine, samples=1, temperature=0.0, seed=0)
        tasks += mine
        episodes += eps
        for task, (ep,) in zip(mine, eps):
            actions[task.id] = [turn.action_text for turn in ep.turns]
    result = score_episodes(suite, tasks, episodes)
    table = result["bfcl"]
    assert set(table["categories"]) == set(data.CATEGORIES) and table["overall_complete"]
    assert "| multi_turn_miss_param" in table["markdown"] and "overall (mean of 4)" in table["markdown"]
    # bfcl-eval's decoders + multi_turn_checker on the very same responses
    verdicts = {t.id: official.grade(data.get_entry(t.id), actions[t.id])[0] for t in tasks}
    mine = {t.id: bool(rs[0] >= 0.5) for t, rs in zip(tasks, result["per_task"].values())}
    assert mine == verdicts
    for category in data.CATEGORIES:
        ids = [t.id for t in tasks if data.category_of(t.id) == category]
        assert table["categories"][category]["accuracy"] == sum(verdicts[i] for i in ids) / len(ids)
    assert 0 < sum(verdicts.values()) < len(verdicts)  # both verdicts occur: the comparison can fail
    official_overall = sum(sum(verdicts[t.id] for t in tasks if data.category_of(t.id) == c) / 3
                           for c in data.CATEGORIES) / 4
    assert table["overall"] == pytest.approx(official_overall)
