"""The env contract and the check_env conformance kit, including planted bugs."""

from __future__ import annotations

import functools
import pickle
import random
import sys
import textwrap

import gymnasium
import pytest

import trace_gym  # noqa: F401  (registers ids)
from foreign_envs import HotColdAdapter, UrandomAdapter, hot_cold_tasks
from environments.guess_number import GuessNumberEnv, make_tasks
from trace_gym.env import checks as env_checks
from trace_gym.env.contract import EnvCheckError, Snapshot, freeze, rng_from_state, rng_state, thaw
from trace_gym.env.checks import check_env
from trace_gym.env.checks import CHECKS, CheckRun
from trace_gym.registry import env_ids, register_envs
from trace_gym.types import Message, Task

TASKS = make_tasks(3)


def test_reference_env_passes_every_check():
    report = check_env(gymnasium.make("trace_gym/GuessNumber-v0"), TASKS)
    assert not report.skipped
    for name in ("gymnasium_api", "protocol", "message_schema", "seeded_determinism", "snapshot_immutable",
                 "snapshot_roundtrip", "branch_isolation", "snapshot_pickle_process", "close_idempotent"):
        assert report.passed.get(name, 0) >= 1, name
    # every turn of every task was snapshotted and replayed in another process
    assert report.passed["snapshot_pickle_process"] == report.passed["snapshot_roundtrip"] >= 3 * 2


def test_without_factory_the_cross_process_check_is_reported_skipped():
    report = check_env(GuessNumberEnv(), TASKS[:1])
    assert "snapshot_pickle_process" in report.skipped
    assert "snapshot_pickle_process" not in report.passed


class UnseededEnv(GuessNumberEnv):
    """Planted bug: the hint noise comes from the global `random`, not the seeded RNG."""

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if obs and obs[0].content in ("higher", "lower") and random.random() < 0.5:
            obs = [Message("user", "lower" if obs[0].content == "higher" else "higher")]
        return obs, reward, term, trunc, info


def test_check_env_catches_a_non_deterministic_env():
    with pytest.raises(EnvCheckError) as err:
        # many tasks, so a 2**-k chance of agreeing by luck is negligible
        check_env(UnseededEnv(lie_prob=0.0), make_tasks(8), gymnasium_checks=False)
    assert err.value.check in ("seeded_determinism", "snapshot_roundtrip", "branch_isolation")


class HistoryEnv(GuessNumberEnv):
    """Keeps a list of guesses; ``alias_in`` plants the shared-state bug."""

    alias_in = "none"  # "snapshot" | "restore" | "none"

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        self.history = []
        return obs, info

    def step(self, action):
        self.history.append(action[:20])
        obs, reward, term, trunc, info = super().step(action)
        return [Message("user", f"{obs[0].content} (guesses so far: {len(self.history)})")], reward, term, trunc, info

    def snapshot(self):
        base = super().snapshot()
        hist = self.history if self.alias_in == "snapshot" else list(self.history)
        return Snapshot(base.env_id, "state", base.turn, (base.state, hist))

    def restore(self, snapshot):
        state, hist = snapshot.state
        super().restore(Snapshot(snapshot.env_id, "state", snapshot.turn, state))
        self.history = hist if self.alias_in == "restore" else list(hist)


def test_correct_history_env_passes():
    env = HistoryEnv()
    assert check_env(env, TASKS, gymnasium_checks=False).passed["branch_isolation"] > 0


def test_check_env_catches_a_snapshot_that_aliases_live_state():
    env = HistoryEnv()
    env.alias_in = "snapshot"
    with pytest.raises(EnvCheckError) as err:
        check_env(env, TASKS, gymnasium_checks=False)
    assert err.value.check == "snapshot_immutable"
    assert "shares mutable state" in str(err.value)


def test_check_env_catches_a_restore_that_aliases_the_snapshot():
    env = HistoryEnv()
    env.alias_in = "restore"
    with pytest.raises(EnvCheckError) as err:
        check_env(env, TASKS, gymnasium_checks=False)
    assert err.value.check in ("snapshot_roundtrip", "branch_isolation")


class ForgetfulRngEnv(GuessNumberEnv):
    """Planted bug: the snapshot omits the env RNG, so noisy hints diverge after restore."""

    def snapshot(self):
        return Snapshot("ForgetfulRngEnv", "state", self._turn, freeze((self._secret, self._turn, self._done)))

    def restore(self, snapshot):
        self._secret, self._turn, self._done = thaw(snapshot.state)


def test_check_env_catches_rng_missing_from_snapshot():
    with pytest.raises(EnvCheckError) as err:
        check_env(ForgetfulRngEnv(lie_prob=0.5), make_tasks(6), gymnasium_checks=False)
    assert err.value.check in ("snapshot_roundtrip", "branch_isolation")


class DictObsEnv(GuessNumberEnv):
    def step(self, action):
        obs, *rest = super().step(action)
        return [m.to_dict() for m in obs], *rest


def test_check_env_catches_bad_message_schema():
    with pytest.raises(EnvCheckError) as err:
        check_env(DictObsEnv(), TASKS, gymnasium_checks=False)
    assert err.value.check == "message_schema"


class BadCloseEnv(GuessNumberEnv):
    def close(self):
        if getattr(self, "_closed", False):
            raise RuntimeError("already closed")
        self._closed = True


def test_check_env_catches_non_idempotent_close():
    with pytest.raises(EnvCheckError) as err:
        check_env(BadCloseEnv(), TASKS[:1], gymnasium_checks=False)
    assert err.value.check == "close_idempotent"


# --- each check alone: it passes on the reference env and fails, by name, on its planted bug


class NoSeedEnv(GuessNumberEnv):
    """Planted bug: ``reset`` takes no ``seed`` (Gymnasium's checker refuses it)."""

    def reset(self, *, options=None):
        return super().reset(options=options)


class UnknownSnapshotModeEnv(GuessNumberEnv):
    """Planted bug: a ``snapshot_mode`` that is not one of ``SNAPSHOT_MODES``."""

    snapshot_mode = "copy"


_RNG_STATES: dict[int, dict] = {}  # process-local: a fresh interpreter starts with it empty


class ProcessLocalRngEnv(GuessNumberEnv):
    """Planted bug: the snapshot holds only a key into a process-local table of RNG states,
    so it restores in this process but not in a fresh one."""

    def snapshot(self):
        key = len(_RNG_STATES)
        _RNG_STATES[key] = rng_state(self._np_random)
        state = freeze((self._secret, self._turn, self._done, key))
        return Snapshot(type(self).__name__, "state", self._turn, state)

    def restore(self, snapshot):
        self._secret, self._turn, self._done, key = thaw(snapshot.state)
        if key in _RNG_STATES:
            self._np_random = rng_from_state(_RNG_STATES[key])


def history_env(alias_in: str) -> HistoryEnv:
    env = HistoryEnv()
    env.alias_in = alias_in
    return env


#: check -> (picklable factory of an env with a bug planted for it, tasks, a piece of its message)
PLANTED = {
    "gymnasium_api": (NoSeedEnv, TASKS, "does not provide a `seed`"),
    "protocol": (UnknownSnapshotModeEnv, TASKS, "got 'copy'"),
    "message_schema": (DictObsEnv, TASKS, "is not a Message"),
    "seeded_determinism": (functools.partial(UnseededEnv, lie_prob=0.0), make_tasks(8), "same seed and actions"),
    "snapshot_immutable": (functools.partial(history_env, "snapshot"), TASKS, "shares mutable state"),
    "snapshot_roundtrip": (functools.partial(ForgetfulRngEnv, lie_prob=0.5), make_tasks(6), "restored after turn"),
    "branch_isolation": (functools.partial(history_env, "restore"), TASKS, "changed the snapshot"),
    "snapshot_pickle_process": (functools.partial(ProcessLocalRngEnv, lie_prob=0.5), make_tasks(6),
                                "restored in another process"),
    "close_idempotent": (BadCloseEnv, TASKS[:1], "close() twice raised RuntimeError: already closed"),
    "replay_deterministic": (functools.partial(UrandomAdapter, snapshot="replay"), hot_cold_tasks(6),
                             "not deterministic under replay"),
}
#: the check that only runs on replay-snapshot envs passes on a deterministic adapter
REFERENCE = {"replay_deterministic": (functools.partial(HotColdAdapter, snapshot="replay"), hot_cold_tasks(3))}


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_check_alone_passes_the_reference_env_and_catches_its_planted_bug(name):
    check = getattr(env_checks, name)
    assert CHECKS[name] is check and check.__name__ == name
    make_good, good_tasks = REFERENCE.get(name, (functools.partial(gymnasium.make, "trace_gym/GuessNumber-v0"), TASKS))
    assert check(CheckRun(make_good(), good_tasks)) >= 1
    make_bad, tasks, message = PLANTED[name]
    with pytest.raises(EnvCheckError) as err:
        check(CheckRun(make_bad(), tasks, make_env=make_bad))
    assert err.value.check == name
    assert str(err.value).startswith(f"[{name}] ") and message in str(err.value) and "\n" not in str(err.value)


def test_check_env_runs_only_the_named_checks_in_their_order():
    assert set(PLANTED) == set(CHECKS)  # every check has its planted bug above
    report = check_env(gymnasium.make("trace_gym/GuessNumber-v0"), TASKS)
    assert list(report.passed) == [c for c in CHECKS if c != "replay_deterministic"]  # a native env
    assert report.snapshot_strategy == "native"
    report = check_env(gymnasium.make("trace_gym/GuessNumber-v0"), TASKS, only=("snapshot_roundtrip", "protocol"))
    assert report.passed == {"protocol": 1, "snapshot_roundtrip": 15} and not report.skipped
    assert check_env(BadCloseEnv(), TASKS[:1], only="snapshot_immutable").passed == {"snapshot_immutable": 5}
    with pytest.raises(ValueError, match="'snapshot_rountrip'"):
        check_env(GuessNumberEnv(), TASKS, only=("snapshot_rountrip",))
    with pytest.raises(ValueError, match="at least one task"):
        check_env(GuessNumberEnv(), [])


def test_check_env_catches_a_snapshot_that_only_restores_in_its_own_process():
    make_env = functools.partial(ProcessLocalRngEnv, lie_prob=0.5)
    with pytest.raises(EnvCheckError) as err:
        check_env(make_env(), make_tasks(6), make_env=make_env)
    assert err.value.check == "snapshot_pickle_process"


def test_malformed_actions_become_observations():
    env = GuessNumberEnv(lie_prob=0.0)
    env.reset(seed=0, options={"task": TASKS[0]})
    for action in ("", "no number here", "guess: 99999999999999999999", "\x00" * 1000):
        obs, reward, term, trunc, info = env.step(action)
        assert isinstance(obs[0], Message) and reward == 0.0
    assert info["error"] == "no_guess"


def test_reset_accepts_task_dict_and_id_and_rejects_garbage():
    env = GuessNumberEnv(tasks=TASKS)
    obs, info = env.reset(options={"task": {"id": "x", "question": "find it", "answer": 5}})
    assert info["task_id"] == "x" and obs[-1].content == "find it"
    _, info = env.reset(options={"task": TASKS[1].id})
    assert info["task_id"] == TASKS[1].id
    with pytest.raises(TypeError, match="options\\['task'\\]"):
        env.reset(options={"task": 3.5})


def test_restore_refuses_a_foreign_snapshot():
    env = GuessNumberEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="Other"):
        env.restore(Snapshot("Other", "state", 0, b""))


def test_types_validate_and_pickle():
    with pytest.raises(ValueError, match="'robot'"):
        Message("robot", "hi")
    task = Task("t1", "q", answer=[1, 2], metadata={"level": 3})
    assert pickle.loads(pickle.dumps(task)) == task
    with pytest.raises(TypeError):
        task.metadata["level"] = 4  # read-only
    assert Task.from_dict(task.to_dict()) == task
    with pytest.raises(ValueError, match="'id'"):
        Task.from_dict({"question": "q"})


def test_builtin_ids_are_registered():
    ids = env_ids()
    for name in ("GuessNumber-v0", "MathPython-v0", "BFCL-v0"):
        assert f"trace_gym/{name}" in ids


def test_third_party_plugin_registers_through_entry_points(tmp_path, monkeypatch):
    """A real installed distribution (dist-info on sys.path) adds an env by entry point."""
    pkg = tmp_path / "my_envs_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from environments.guess_number import GuessNumberEnv
        class TinyEnv(GuessNumberEnv):
            pass
    """))
    dist = tmp_path / "my_envs_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-envs-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[trace_gym.envs]\nTiny-v0 = my_envs_pkg:TinyEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import trace_gym.registry as reg

    monkeypatch.setattr(reg, "_plugins_loaded", False)
    added = register_envs()
    assert "trace_gym/Tiny-v0" in added
    env = gymnasium.make("trace_gym/Tiny-v0")
    assert type(env.unwrapped).__name__ == "TinyEnv"
    gymnasium.registry.pop("trace_gym/Tiny-v0")
    sys.modules.pop("my_envs_pkg", None)


def test_check_env_replays_an_env_registered_outside_trace_gym_in_a_fresh_process():
    """The worker gets the spec itself, so an id it never registered still builds."""
    gymnasium.register(id="custom_ns/Guess-v0", entry_point="environments.guess_number.env:GuessNumberEnv",
                       kwargs={"lie_prob": 0.3})
    try:
        report = check_env(gymnasium.make("custom_ns/Guess-v0"), TASKS[:2])
        assert report.passed["snapshot_pickle_process"] >= 2 and not report.skipped
    finally:
        gymnasium.registry.pop("custom_ns/Guess-v0")


def test_check_env_worker_builds_a_factory_that_names_an_id_only_this_process_registered():
    """A ``gymnasium.make`` partial by id travels as the id's spec: the worker registers nothing."""
    import functools

    gymnasium.register(id="custom_ns/GuessById-v0", entry_point="environments.guess_number.env:GuessNumberEnv")
    try:
        factory = functools.partial(gymnasium.make, "custom_ns/GuessById-v0", disable_env_checker=True)
        report = check_env(GuessNumberEnv(), TASKS[:1], make_env=factory)
        assert report.passed["snapshot_pickle_process"] >= 2 and not report.skipped
    finally:
        gymnasium.registry.pop("custom_ns/GuessById-v0")
    source = open(sys.modules["trace_gym.env.play"].__file__).read()
    assert "registry" not in source.split('if __name__ == "__main__":')[1]


def test_reference_actions_is_an_optional_protocol():
    from trace_gym.env.contract import ReferenceActions

    assert isinstance(GuessNumberEnv(), ReferenceActions)
    assert not isinstance(object(), ReferenceActions)


def test_importing_trace_gym_does_not_mark_plugins_loaded():
    import trace_gym.registry as reg

    reg.register_envs(plugins=False)
    before = reg._plugins_loaded
    reg.register_envs(plugins=False)
    assert reg._plugins_loaded == before  # only a plugin load sets the flag


def test_stop_strings_are_read_from_every_kind_of_factory_without_building_an_env():
    import functools

    from environments.wiki_qa.env import WikiQAEnv
    from trace_gym.env.contract import StopStrings, _portable, env_class, env_stop_strings
    from trace_gym.registry import ENV_FAMILIES

    tags = ("</search>", "</answer>", "</tool_call>")
    by_id = functools.partial(gymnasium.make, "trace_gym/WikiQA-v0", disable_env_checker=True)
    factories = {"class": WikiQAEnv, "partial(make, id)": by_id, "partial(make, spec)": _portable(by_id),
                 "partial(class)": functools.partial(WikiQAEnv, topk=2), "family": ENV_FAMILIES["wiki_qa"].make_env}
    for name, factory in factories.items():
        assert env_class(factory) is WikiQAEnv, name
        assert env_stop_strings(factory) == tags, name
    assert isinstance(WikiQAEnv, StopStrings) and not isinstance(GuessNumberEnv, StopStrings)
    assert env_stop_strings(GuessNumberEnv) == ()  # declares none
    assert env_stop_strings(lambda: GuessNumberEnv()) == ()  # opaque factory: nothing to read
    assert env_stop_strings(functools.partial(gymnasium.make, "nobody/Unknown-v0")) == ()
    assert env_stop_strings(functools.partial(gymnasium.make, id="trace_gym/WikiQA-v0")) == tags

    def make_wiki(**kwargs):  # a plugin's entry point may be a function carrying the attribute
        return WikiQAEnv(**kwargs)

    make_wiki.stop_strings = ("</go>",)
    gymnasium.register(id="test_stops/Func-v0", entry_point=make_wiki)
    try:
        assert env_stop_strings(functools.partial(gymnasium.make, "test_stops/Func-v0")) == ("</go>",)
        assert env_class(functools.partial(gymnasium.make, "test_stops/Func-v0")) is None  # not a class
    finally:
        gymnasium.registry.pop("test_stops/Func-v0")

    class BadStops(GuessNumberEnv):
        stop_strings = "</search>"  # a bare string, not a tuple

    with pytest.raises(ValueError, match=r"BadStops.stop_strings must be a tuple of non-empty strings, got '</search>'"):
        env_stop_strings(BadStops)


def test_guess_number_reads_the_last_integer_with_guess_format_number():
    from environments.guess_number.env import GuessNumberEnv, make_tasks

    env = GuessNumberEnv(high=8, guess_format="number", lie_prob=0.0)
    task = make_tasks(1, high=8, seed=3)[0]
    env.reset(seed=0, options={"task": task})
    other = 1 if task.answer != 1 else 2
    obs, reward, done, _, info = env.step(f"Between 1 and 8 I pick {other}.")
    assert info["guess"] == other and reward == 0.0 and not done
    obs, reward, done, _, info = env.step("9" * 40)  # a digit run beyond 12 digits is no guess, not a crash
    assert info.get("error") == "no_guess"
    obs, reward, done, _, _ = env.step(f"maybe {other}, no: {task.answer}")
    assert reward == 1.0 and done
    tagged = GuessNumberEnv(high=8)
    tagged.reset(seed=0, options={"task": task})
    assert tagged.step(f"I pick {task.answer}")[4].get("error") == "no_guess"  # the default is unchanged
    with pytest.raises(ValueError, match="guess_format must be one of"):
        GuessNumberEnv(guess_format="loose")
    from trace_gym.env.checks import check_env

    assert check_env(GuessNumberEnv(high=8, guess_format="number"), make_tasks(3, high=8)).passed


def test_check_env_is_a_short_orchestrator_over_named_checks():
    import ast
    import inspect

    from trace_gym.env import checks as env_module
    from trace_gym.env.checks import CHECKS

    node = next(n for n in ast.parse(inspect.getsource(env_module)).body
                if isinstance(n, ast.FunctionDef) and n.name == "check_env")
    assert node.end_lineno - node.lineno + 1 <= 60
    assert all(fn.__name__ == name for name, fn in CHECKS.items())  # each check is named as it reports
