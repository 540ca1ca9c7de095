"""A user's own skyrl-gym env, written and registered the way SkyRL's docs have a plugin do
it (``skyrl_gym.register(id=..., entry_point="module:Class")`` on import), for
tests/test_ecosystem_skyrl.py; and small SkyRL datasets written to a folder."""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_ID = "ecosystem_vault"


class VaultEnv(BaseTextEnv):
    """Open a vault: guess its code in ``<code>N</code>`` tags, told ``higher``/``lower``
    (a hint that lies with probability 0.25, drawn from the global ``random`` module, as
    many community envs do). Reward 1.0 on the step that opens it; done then or after
    ``max_turns`` guesses (extras, else ``extra_info``, else 6)."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] = {}):
        super().__init__()
        self.code = int(extras["reward_spec"]["ground_truth"])
        self.max_turns = int(extras.get("max_turns") or extras.get("extra_info", {}).get("max_turns", 6))
        self.guesses: list[int] = []

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        found = re.findall(r"<code>\s*(-?\d{1,9})\s*</code>", action)
        if not found:
            feedback, reward = "Write your guess as <code>N</code>.", 0.0
        else:
            guess = int(found[-1])
            self.guesses.append(guess)
            if guess == self.code:
                return BaseTextEnvStepOutput(observations=[], reward=1.0, done=True, metadata={"guesses": self.guesses})
            lie = random.random() < 0.25
            feedback, reward = ("higher" if (guess < self.code) != lie else "lower"), 0.0
        done = self.turns >= self.max_turns
        observations = [] if done else [{"role": "user", "content": feedback}]
        return BaseTextEnvStepOutput(observations=observations, reward=reward, done=done, metadata={})


if ENV_ID not in skyrl_gym.registry:
    skyrl_gym.register(id=ENV_ID, entry_point="ecosystem_envs_skyrl:VaultEnv")


def _chat(question: str) -> list[dict]:
    return [{"role": "system", "content": "Answer carefully."}, {"role": "user", "content": question}]


def gsm8k_rows(env_class: str = "gsm8k_multi_turn") -> list[dict]:
    """Rows as SkyRL's gsm8k preprocessing writes them (``gsm8k`` and ``gsm8k_multi_turn`` read the same)."""
    items = [("Tom has 3 apples and buys 4 more. How many?", "7"), ("What is 6 times 2?", "12"),
             ("A box holds 5 pens; how many pens in 3 boxes?", "15"), ("What is 100 minus 58?", "42")]
    return [{"data_source": "openai/gsm8k", "prompt": _chat(q + " Let's think step by step and output the final "
                                                          "answer after '####'."),
             "env_class": env_class, "reward_spec": {"method": "rule", "ground_truth": a},
             "extra_info": {"split": "train", "index": i, "max_turns": 3}} for i, (q, a) in enumerate(items)]


def vault_rows() -> list[dict]:
    return [{"prompt": _chat(f"Open vault {i}: its code is between 1 and 20."), "env_class": ENV_ID,
             "reward_spec": {"ground_truth": str(code)}, "extra_info": {"max_turns": 5}}
            for i, code in enumerate([13, 4, 17, 9])]


SQL_QUESTIONS = [("How many singers are there?", "SELECT count(*) FROM singer"),
                 ("What is the largest age of a singer?", "SELECT max(age) FROM singer"),
                 ("How many singers are older than 30?", "SELECT count(*) FROM singer WHERE age > 30")]


def sql_rows() -> list[dict]:
    """text2sql rows (SkyRL's SynSQL/Spider layout): ``db_id``, ``data``, gold SQL as ground truth."""
    return [{"prompt": _chat(f"Database concert_singer. {q} Think in <think>, query with <sql>, answer in "
                             "<solution>."),
             "env_class": "text2sql", "db_id": "concert_singer", "data": "spider",
             "reward_spec": {"method": "rule", "ground_truth": sql}, "extra_info": {"split": "train"}}
            for q, sql in SQL_QUESTIONS]


def write_sql_db(root: Path) -> Path:
    """A Spider-layout database under ``root`` (the text2sql env's ``db_path``); integer
    columns only, so query results print in one order in every process."""
    folder = root / "spider" / "database" / "concert_singer"
    folder.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(folder / "concert_singer.sqlite") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS singer (singer_id INTEGER PRIMARY KEY, age INTEGER)")
        conn.executemany("INSERT OR REPLACE INTO singer VALUES (?, ?)", [(1, 25), (2, 31), (3, 44), (4, 29)])
    return root


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)
