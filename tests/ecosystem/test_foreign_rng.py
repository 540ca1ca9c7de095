"""Envs that draw from the process-global RNGs (GEM's games, issue 44 "Also"): each env draws
from generators of its own, bound to the thread that runs its call, so a hung call holds up no
other env (before, one process-wide lock was held across every such call, until its 300 s
deadline), and calls of two envs that overlap still draw exactly what each would draw alone.
Every order is forced with events; a wait with a timeout only detects a call that is held up."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from trace_gym.env.adapter import ForeignEnv
from trace_gym.types import Message, Task

HUNG_DEADLINE_S = 600.0  # a hung call's deadline: what a second env would wait for under a lock
HELD_UP_S = 60.0  # a healthy env not done by then was held up by the hung one
TASK = Task(id="dice/0", prompt="roll", metadata={"seed": 7})
ACTIONS = ["roll", "roll", "roll", "roll"]


class DiceEpisode:
    """A GEM-like driver: ``begin`` seeds the global ``random`` and ``numpy.random`` (as GEM's
    ``reset(seed)`` does) and every ``act`` draws from both; ``pause(where)`` runs at the named
    point (``"make"``, ``"begin"``, ``"act"``: between the two draws of a step)."""

    snapshot_strategies = ("copy", "replay")
    global_rng = True

    def __init__(self, pause=None):
        self.pause = pause or (lambda where: None)
        self.env_key = "dice"
        self.rolls: list = []

    def prepare(self):
        self.pause("make")

    def begin(self, task, seed):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.pause("begin")
        self.rolls = [random.randint(1, 6)]
        return [Message("user", f"first {self.rolls[0]}")], {}

    def act(self, action):
        a = random.randint(1, 6)
        self.pause("act")
        b = int(np.random.randint(1, 7))
        random.shuffle(self.rolls)  # a function bound to random's instance (GEM imports shuffle by name)
        self.rolls.append((a, b))
        return [Message("user", f"{a} {b} {self.rolls}")], 0.0, False, False, {}

    def state(self):
        return list(self.rolls)

    def set_state(self, state):
        self.rolls = list(state)

    def end(self):
        pass

    def default_tasks(self):
        return [TASK]

    def load_task(self, task_id):
        raise ValueError(task_id)


def dice_env(pause=None, timeout: float = HUNG_DEADLINE_S) -> ForeignEnv:
    return ForeignEnv(DiceEpisode(pause), call_timeout_s=timeout)


def play(env: ForeignEnv, task: Task = TASK) -> list[str]:
    """An episode, a snapshot after its second step, and that step replayed from the snapshot."""
    texts = [env.reset(options={"task": task})[0][0].content]
    for i, action in enumerate(ACTIONS):
        texts.append(env.step(action)[0][0].content)
        if i == 1:
            snap = env.snapshot()
    env.restore(snap)
    texts.append(env.step("roll")[0][0].content)
    return texts


def gem_play() -> list[str]:
    """A real GEM game (GuessTheNumber draws its secret from the global ``random``)."""
    pytest.importorskip("gem")
    from environments.ecosystems.gem import GemEnv, load_tasks

    task = load_tasks(1, 11, gem_id="game:GuessTheNumber-v0-easy")[0]
    env = GemEnv("game:GuessTheNumber-v0-easy")
    obs = [env.reset(options={"task": task})[0][0].content]
    obs += [env.step(f"\\boxed{{{g}}}")[0][0].content for g in (5, 3, 8)]
    env.close()
    return obs


class Hang:
    """A pause that blocks at one point until released, saying when it got there."""

    def __init__(self, at: str):
        self.at, self.entered, self.release = at, threading.Event(), threading.Event()

    def __call__(self, where: str) -> None:
        if where == self.at:
            self.entered.set()
            self.release.wait(HUNG_DEADLINE_S)


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("at", ["make", "begin", "act"])
def test_a_hung_call_holds_up_no_other_env(at):
    alone_dice, alone_gem = play(dice_env()), gem_play()
    hang = Hang(at)

    def hung():
        env = dice_env(hang)  # "make" hangs here, in prepare()
        env.reset(options={"task": TASK})
        return env.step("roll")

    hung_thread, _ = _in_thread(hung)
    try:
        assert hang.entered.wait(HELD_UP_S), "the planted env never reached its hang"
        healthy, out = _in_thread(lambda: (play(dice_env()), gem_play()))
        healthy.join(HELD_UP_S)
        held_up = healthy.is_alive()
        still_hung = not hang.release.is_set() and hung_thread.is_alive()
    finally:
        hang.release.set()
    hung_thread.join(HELD_UP_S)
    healthy.join(HELD_UP_S)
    assert still_hung and not held_up, "a second env waited for the hung call"
    assert "error" not in out, out.get("error")
    assert out["value"] == (alone_dice, alone_gem)  # and drew exactly what it draws alone


@pytest.mark.timeout(300)
def test_overlapping_calls_of_two_envs_each_draw_their_own_numbers():
    """Env A's step stops between its two draws; env B then plays a whole episode, and the process
    draws from the globals itself; then A goes on. Each sees exactly what it sees alone (one
    global state shared by both, saved and restored around each call, would fail here)."""
    alone_a, alone_b = play(dice_env()), play(dice_env(), Task(id="dice/1", prompt="roll", metadata={"seed": 99}))
    random.seed(123)
    np.random.seed(123)
    process_alone = [random.random(), float(np.random.random())]
    random.seed(123)
    np.random.seed(123)
    hang = Hang("act")
    a = dice_env(hang)
    a_thread, a_out = _in_thread(lambda: play(a))
    try:
        assert hang.entered.wait(HELD_UP_S)
        b_thread, b_out = _in_thread(lambda: play(dice_env(), Task(id="dice/1", prompt="roll", metadata={"seed": 99})))
        b_thread.join(HELD_UP_S)
        b_held_up = b_thread.is_alive()
        process = [random.random(), float(np.random.random())]  # the process's own draws, meanwhile
    finally:
        hang.at = "never again"  # A's later steps run through
        hang.release.set()
    a_thread.join(HELD_UP_S)
    assert not b_held_up and "error" not in a_out and "error" not in b_out
    assert a_out["value"] == alone_a and b_out["value"] == alone_b
    assert process == process_alone  # neither env drew from the process's state, nor it from theirs


def test_a_given_up_call_leaves_the_envs_generators_as_they_were():
    hang = Hang("act")
    env = dice_env(hang, timeout=0.5)
    env.reset(options={"task": TASK})
    before = env._random.state
    try:
        info = env.step("roll")[4]
    finally:
        hang.release.set()
    assert "gave no reply within call_timeout_s=0.5 s" in info["env_error"]
    after = env._random.state
    assert after[0] == before[0] and np.array_equal(after[1][1], before[1][1])
