"""The reference environment: a tiny multi-turn number-guessing game."""

from environments.guess_number.env import GuessNumberEnv, make_tasks

__all__ = ["GuessNumberEnv", "make_tasks"]
