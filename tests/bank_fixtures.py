"""Rollout-bank fixtures: a scripted policy, a small GuessNumber family, and a synthetic bank writer.

Imported by ``test_bank.py`` and by the recorder it runs (and kills) in a subprocess.
"""

from __future__ import annotations

import functools
import time
import zlib
from pathlib import Path

import numpy as np

from environments.guess_number.env import GuessNumberEnv, make_tasks
from trace_gym.banks.writer import BankWriter
from trace_gym.types import Completion

TOKENIZER = Path(__file__).resolve().parent / "data" / "smollm2_tokenizer"


class ScriptedPolicy:
    """A deterministic engine: each completion is chosen by a hash h of the prefix, the request's
    ``n`` and the completion's index (so identical requests get identical answers, which lets a live
    run and a recording be compared turn by turn): ``guess: N`` with N in 1..4, or, with
    ``style="code"``, a Python cell printing a number (2 times in 3) or a boxed answer."""

    def __init__(self, delay: float = 0.0, style: str = "guess"):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
        self.delay, self.style = delay, style

    def _text(self, h: int) -> str:
        if self.style == "guess":
            return f"guess: {1 + h % 4}"
        return f"```python\nprint({h % 7})\n```" if h % 3 else f"The answer is \\boxed{{{h % 7}}}"

    def generate(self, prefixes, n, sampling):
        time.sleep(self.delay)
        out = []
        for prefix, k in zip(prefixes, n):
            replies = []
            for i in range(k):
                h = zlib.crc32(np.asarray([*prefix, k, i], dtype=np.int64).tobytes())
                text = self._text(h)
                ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                replies.append(Completion(ids, [0.0] * len(ids), "stop", cached_tokens=h % 3, text=text))
            out.append(replies)
        return out

    def reset_prefix_cache(self):
        pass

    def close(self):
        pass


class SmallGuess:
    """GuessNumber with secrets in 1..4 and 3 turns: a scripted guesser gets mixed outcomes."""

    env_id = "trace_gym/GuessNumber-v0"
    env_kwargs = {"low": 1, "high": 4, "max_turns": 3}

    def make_env(self):
        return GuessNumberEnv(**self.env_kwargs)

    def load_tasks(self, n, seed=0):
        return make_tasks(n, low=1, high=4, seed=seed)


# ---------------------------------------------------------------------- synthetic banks
def _turn(depth: int, action: str, obs: str, cost: int) -> dict:
    return {"depth": depth, "action": action, "observation": [{"role": "user", "content": obs}],
            "finish_reason": "stop", "truncation": None, "env_error": None, "cached_tokens": None,
            "policy_tokens": cost, "observation_tokens": 3, "context_tokens": 20 * depth,
            "prefill_tokens": 20 * depth, "env_steps": 1}


def _episode(win: bool, start: int, turns: int, tag: str, cost: int) -> dict:
    steps = [_turn(d, f"{tag} action {d}", f"{tag} obs {d}", cost) for d in range(start, turns + 1)]
    reward = 1.0 if win else 0.0
    return {"error": None, "reward": reward, "success": win, "end": "terminated", "turns": steps}


def synthetic_record(i: int, successes: int, roots: int, continuations: int, turns: int = 3,
                     rng: np.random.Generator | None = None, cap: int | None = None) -> dict:
    """Prompt ``i``: ``successes`` of its ``roots`` roots succeed (in a shuffled order); every prefix of
    every root gets ``continuations`` continuations, each a success with probability 1/2."""
    rng = rng or np.random.default_rng(i)
    wins = rng.permutation([True] * successes + [False] * (roots - successes))
    out = []
    for j, win in enumerate(wins):
        root = _episode(bool(win), 1, turns, f"p{i} r{j}", cost=10 + j)
        depths = list(range(1, turns))[:cap]
        root["prefixes"] = [{"depth": t, "continuations": [
            _episode(bool(rng.random() < 0.5), t + 1, turns, f"p{i} r{j} t{t} c{c}", cost=5) | {"replayed_env_steps": t}
            for c in range(continuations)]} for t in depths]
        root["left_out"] = [t for t in range(1, turns) if t not in depths]
        root["seed"] = 1000 * i + j
        out.append(root)
    task = {"id": f"synth/{i}", "prompt": f"synthetic prompt {i}", "answer": None, "source": "synthetic",
            "metadata": {}}
    return {"task": task, "task_index": i, "prompt_tokens": 20, "roots": out}


def write_synthetic_bank(path, successes, roots: int, continuations: int, turns: int = 3, seed: int = 0,
                         cap: int | None = None) -> Path:
    """A complete bank file with known success counts per prompt (``successes[i]`` of ``roots``)."""
    manifest = {"policy": "synthetic", "policy_path": None, "weights_sha256": None, "env_id": "synthetic",
                "env_kwargs": {}, "seed": seed, "prompts": len(successes), "roots": roots,
                "continuations": continuations, "max_prefixes_per_root": cap, "sampling": {}, "agent": {},
                "command": ["synthetic"], "created_at": 0.0}
    writer = BankWriter(path, manifest)
    writer.start_run(["synthetic"])
    rng = np.random.default_rng(seed)
    for i, s in enumerate(successes):
        writer.add(synthetic_record(i, int(s), roots, continuations, turns, rng, cap) | {"run": 0, "written_at": 0.0})
    writer.finish()
    return Path(path)


@functools.cache
def small_family() -> SmallGuess:
    return SmallGuess()
