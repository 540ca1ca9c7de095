"""Replay snapshots: stateful code across turns (seeded random, numpy, files) restores to
identical observations, in the same env, a second env, and across a kernel restart; a
replay is bounded by its own budget, and one that runs out ends the continuation cleanly."""

from __future__ import annotations

import pickle
import time

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
    from trace_gym.env.contract import Snapshot

    with pytest.raises(ValueError, match="cannot restore"):
        a.restore(Snapshot("OtherEnv", "replay", 0, snap.state))


SLACK_S = 6.0  # kernel start-up and kills on a loaded 2-core machine


def late_loop(deadline: float) -> str:
    """A cell that prints at once before ``deadline`` (wall clock) and never ends after it:
    recorded fast, it stalls every replay that comes later (a hostile prefix)."""
    return f"```python\nimport time\nif time.time() > {deadline!r}:\n    while True:\n        pass\nprint('fast')\n```"


def test_a_replay_that_cannot_finish_ends_the_continuation_within_its_budget():
    # unbounded, the replay would take 5 cells x 3 x 3 s = 45 s; its budget is the step timeout, 2 s
    env = MathPythonEnv([TASK], max_turns=20, step_timeout_s=2.0, limits=KernelLimits(cell_timeout_s=3.0))
    try:
        env.reset(seed=3, options={"task": TASK})
        play(env, [SCRIPT[0]])
        clean = env.snapshot()
        deadline = time.time() + 0.5
        recorded = play(env, [late_loop(deadline)] * 5)
        assert all("fast" in obs[0].content for obs, *_ in recorded)
        hostile = env.snapshot()
        assert env.replay_steps(hostile) == 6  # the ledger's count of a restore's cost, as before
        time.sleep(max(0.0, deadline - time.time()) + 0.1)
        env.restore(hostile)
        t0 = time.monotonic()
        obs, reward, terminated, truncated, info = env.step("```python\nprint('continued')\n```")
        elapsed = time.monotonic() - t0
        assert elapsed < env.replay_timeout_s + SLACK_S, f"the first step took {elapsed:.1f} s"
        assert truncated and not terminated and reward == 0.0
        assert info["env_error"].startswith("replay_timeout") and "infra_error" not in info
        text = obs[0].content
        text.encode("utf-8")
        assert "took longer than 2 s" in text and "episode ends here" in text and "continued" not in text
        replay = info["exec"]["replay"]
        assert replay["timed_out"] and replay["cells"] == 6 and replay["replayed"] == 2, replay
        assert replay["diverged"] == [{"cell": 1, "recorded": "ok", "replayed": "timeout"}]
        assert info["exec"]["cells"] == [{"status": "skipped"}] and info["reward_components"]["infra_error"] == 0.0
        # not wedged: the episode is over, and the env restores and resets as ever
        assert env.step("```python\nprint(1)\n```")[0][0].content == "The episode is over."
        env.restore(clean)
        obs, _, _, truncated, info = env.step("```python\nprint(len(seq))\n```")
        assert obs[0].content == "```output\n3\n```" and not truncated and info["exec"]["replay"]["cells"] == 1
        env.restore(hostile)  # the same stall, again cleanly
        assert "env_error" in env.step("```python\nprint(2)\n```")[4]
        env.reset(seed=4)
        assert env.step("```python\nprint(6 * 7)\n```")[0][0].content == "```output\n42\n```"
    finally:
        env.close()


def test_the_replay_has_a_budget_of_its_own_and_the_step_keeps_its_own():
    # the replay takes ~1.2 s, the step's cell ~1.2 s: together over the 2 s step limit
    env = MathPythonEnv([TASK], max_turns=20, step_timeout_s=2.0, limits=KernelLimits(cell_timeout_s=3.0))
    try:
        env.reset(seed=3, options={"task": TASK})
        play(env, ["```python\nimport time\ntime.sleep(0.6)\nx = 1\n```"] * 2)
        env.restore(env.snapshot())
        obs, _, _, truncated, info = env.step("```python\nimport time\ntime.sleep(1.2)\nprint(x + 41)\n```")
        assert obs[0].content == "```output\n42\n```", obs[0].content
        assert not truncated and info["exec"]["replay"]["replayed"] == 2 and not info["exec"]["replay"]["timed_out"]
        assert info["exec"]["replay"]["elapsed"] >= 1.2 and info["exec"]["elapsed"] >= 1.2
    finally:
        env.close()


def test_replay_budget_is_validated():
    with pytest.raises(ValueError, match="replay_timeout_s"):
        MathPythonEnv([TASK], replay_timeout_s=0, prestart_kernel=False)
    assert MathPythonEnv([TASK], step_timeout_s=7.0, prestart_kernel=False).replay_timeout_s == 7.0
