"""Replay snapshots: stateful code across turns (seeded random, numpy, files) restores to
identical observations, in the same env, a second env, and across a kernel restart."""

from __future__ import annotations

import pickle

import pytest

from environments.math_python.env import MathPythonEnv
from environments.math_python.sandbox import KernelLimits
from trace_gym.types import Task

TASK = Task(id="s1", prompt="Pick numbers.", answer="3")
SCRIPT = [
    "```python\nimport random\nimport numpy as np\nseq = [random.randint(0, 10**9) for _ in range(3)]\nprint(seq)\n```",
    "```python\nseq.append(int(np.random.randint(0, 10**9)))\nopen('state.txt', 'w').write(repr(seq))\n"
    "print(random.random(), len(seq))\n```",
    "```python\nprint(open('state.txt').read() == repr(seq), random.getrandbits(64), np.random.rand())\n```",
    "```python\nsorted({'pear', 'fig', 'kiwi'} | {str(x) for x in seq})[:3]\n```",
]


@pytest.fixture(scope="module")
def envs():
    a, b = MathPythonEnv([TASK], max_turns=10), MathPythonEnv([TASK], max_turns=10)
    yield a, b
    a.close()
    b.close()


def play(env, actions):
    return [(tuple(o), r, te, tr) for o, r, te, tr, _ in (env.step(a) for a in actions)]


def test_restore_replays_to_identical_observations(envs):
    a, b = envs
    a.reset(seed=5, options={"task": TASK})
    snaps, trajectory = [a.snapshot()], []
    for action in SCRIPT:
        trajectory += play(a, [action])
        snaps.append(a.snapshot())
    assert "True" in trajectory[2][0][0].content
    for t in (0, 1, 2, 3):
        a.restore(snaps[t])
        assert play(a, SCRIPT[t:]) == trajectory[t:], f"same env, restored after turn {t}"
        b.reset(seed=99)
        b.restore(pickle.loads(pickle.dumps(snaps[t])))
        assert play(b, SCRIPT[t:]) == trajectory[t:], f"second env, restored after turn {t}"


def test_branches_do_not_leak(envs):
    a, _ = envs
    a.reset(seed=5, options={"task": TASK})
    play(a, SCRIPT[:2])
    snap = a.snapshot()
    expected = play(a, SCRIPT[2:3])
    a.restore(snap)
    play(a, ["```python\nseq.clear()\nrandom.seed(0)\nimport os\nos.remove('state.txt')\n```"])
    a.restore(snap)
    assert play(a, SCRIPT[2:3]) == expected


def test_replay_is_reported_and_output_discarded(envs):
    a, _ = envs
    a.reset(seed=5, options={"task": TASK})
    play(a, SCRIPT[:2])
    snap = a.snapshot()
    a.restore(snap)
    obs, _, _, _, info = a.step("```python\nprint('after')\n```")
    assert obs[0].content == "```output\nafter\n```"  # nothing of the replayed cells shows
    assert info["exec"]["replay"]["cells"] == 2 and info["exec"]["replay"]["diverged"] == []


def test_snapshot_across_a_kernel_restart():
    env = MathPythonEnv([TASK], max_turns=10, limits=KernelLimits(cell_timeout_s=1.5))
    try:
        env.reset(seed=8, options={"task": TASK})
        play(env, [SCRIPT[0], "```python\nimport ctypes\nctypes.string_at(0)\n```"])
        snap = env.snapshot()  # generation 1, no live cells
        after = play(env, ["```python\nimport random\nprint(random.random())\nprint('seq' in dir())\n```"])
        assert "False" in after[0][0][0].content
        env.restore(snap)
        assert play(env, ["```python\nimport random\nprint(random.random())\nprint('seq' in dir())\n```"]) == after
        state = pickle.loads(snap.state)
        assert state["generation"] == 1 and state["cells"] == ()
    finally:
        env.close()


def test_snapshot_is_immutable_and_checked(envs):
    a, _ = envs
    a.reset(seed=5, options={"task": TASK})
    snap = a.snapshot()
    blob = pickle.dumps(snap)
    play(a, SCRIPT[:2])
    assert pickle.dumps(snap) == blob and snap.mode == "replay" and snap.turn == 0
    from trace_gym.env import Snapshot

    with pytest.raises(ValueError, match="cannot restore"):
        a.restore(Snapshot("OtherEnv", "replay", 0, snap.state))
