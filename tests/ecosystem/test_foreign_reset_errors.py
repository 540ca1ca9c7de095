"""A foreign env's reset that raises reaches the caller in one line naming the env (issue 44,
"Also"), of the exception's own type where that type takes a message, so that callers'
``except`` clauses hold; planted in several variants, through reset and through a replay restore."""

from __future__ import annotations

import pytest

from foreign_envs import HotColdEpisode, hot_cold_tasks
from trace_gym.env.adapter import ForeignEnv
from trace_gym.env.boundary import ForeignEnvError, ForeignReplyError
from trace_gym.types import Message


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


class TwoArgs(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)


def failing(raise_it, *, replay: bool = False) -> ForeignEnv:
    class Failing(HotColdEpisode):
        def __init__(self):
            super().__init__()
            self.env_key, self.fail = "planted-env", False

        def begin(self, task, seed):
            if self.fail:
                return raise_it()
            return super().begin(task, seed)

    return ForeignEnv(Failing(), snapshot="replay" if replay else None)


VARIANTS = [
    (lambda: (_ for _ in ()).throw(ValueError("bad seed")), ValueError, "ValueError: bad seed"),
    (lambda: (_ for _ in ()).throw(ConnectionError("server down\nretry later")), ConnectionError,
     "ConnectionError: server down retry later"),
    (lambda: {}["missing"], ForeignEnvError, "KeyError: 'missing'"),  # KeyError would quote the message
    (lambda: (_ for _ in ()).throw(TwoArgs(3, "no")), ForeignEnvError, "TwoArgs: (3, 'no')"),
    (lambda: (_ for _ in ()).throw(Unprintable()), ForeignEnvError, "Unprintable: <its message could not be read>"),
    (lambda: ("not a list", {}), ForeignReplyError, "an observation must be a list of Messages"),
    (lambda: ([Message("user", "hi")], "info?"), ForeignReplyError, "info must be a dict"),
]


@pytest.mark.parametrize("raise_it, kind, detail", VARIANTS)
@pytest.mark.parametrize("through", ["reset", "restore"])
def test_a_raising_reset_names_the_env_in_one_line(raise_it, kind, detail, through):
    env = failing(raise_it, replay=through == "restore")
    task = hot_cold_tasks(1, seed=4)[0]
    env.reset(options={"task": task})
    env.step("5")
    snap = env.snapshot()
    env.episode.fail = True
    with pytest.raises(kind) as err:
        env.restore(snap) if through == "restore" else env.reset(options={"task": task})
    text = str(err.value)
    assert text.startswith("planted-env: its reset raised ") and detail in text and "\n" not in text, text
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("3")  # no episode began


def test_a_message_that_names_the_env_already_is_left_as_it_is():
    error = ValueError("--env planted-env: the dataset cannot be fetched offline")
    env = failing(lambda: (_ for _ in ()).throw(error))
    env.episode.fail = True
    with pytest.raises(ValueError) as err:
        env.reset(options={"task": hot_cold_tasks(1)[0]})
    assert err.value is error
