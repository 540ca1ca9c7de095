"""skyrl-gym envs through environments/ecosystems/skyrl.py: built-in envs (gsm8k,
gsm8k_multi_turn, text2sql on a local SQLite database) and a user's own env registered with
``skyrl_gym.register`` (tests/fixtures/ecosystem_envs_skyrl.py), resolved as ``skyrl:<env_class>``
from local SkyRL datasets, pass check_env under copy and replay; rewards are skyrl's own
scores; hostile actions, bad names and bad options are handled in one line. Offline."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("skyrl_gym")

import ecosystem_envs_skyrl as data  # noqa: E402  (registers the user's env, as a --plugin module would)
from registry_fixtures import registries_restored  # noqa: E402
from trace_gym.api import resolve_env  # noqa: E402
from trace_gym.env.checks import check_env  # noqa: E402
from trace_gym.types import Task  # noqa: E402

HOSTILE = "#### " + "9\x00" * 30_000 + "<sql>SELECT" * 3_000 + "<code>" * 3_000 + "<solution>" + "<think>" * 2_000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("skyrl_data")
    return {"gsm8k_multi_turn": data.write_jsonl(root / "gsm8k_mt.jsonl", data.gsm8k_rows()),
            "gsm8k": data.write_parquet(root / "gsm8k.parquet", data.gsm8k_rows("gsm8k")),
            "text2sql": data.write_parquet(root / "sql.parquet", data.sql_rows()),
            data.ENV_ID: data.write_jsonl(root / "vault.jsonl", data.vault_rows()),
            "db_path": str(data.write_sql_db(root / "sql_data"))}


@pytest.fixture(scope="module", autouse=True)
def _restore_registries():
    with registries_restored(lambda name, module: False):
        yield


def _id(files, env_class, **options):
    query = "&".join(f"{k}={v}" for k, v in {"path": files[env_class], **options}.items())
    if env_class == "text2sql":
        query += f"&env_config.db_path={files['db_path']}"
    return f"skyrl:{env_class}?{query}"


SQL_RIGHT = ["<think>count them</think><sql>SELECT count(*) FROM singer</sql>",
             "<think>4 singers</think><solution>SELECT count(*) FROM singer</solution>"]
CASES = {  # env class -> actions that reach several turns (the last ones end most episodes)
    "gsm8k_multi_turn": ["first I add #### 5", "no answer here", "#### 7", "#### 12"],
    "text2sql": ["<think>look</think><sql>SELECT max(age) FROM singer</sql>", "no tags at all", *SQL_RIGHT],
    data.ENV_ID: ["<code>10</code>", "hmm", "<code>5</code>", "<code>15</code>", "<code>13</code>"],
}


@pytest.mark.parametrize("env_class, strategy", [("gsm8k_multi_turn", "copy"), ("text2sql", "copy"),
                                                 (data.ENV_ID, "copy"), (data.ENV_ID, "replay")])
def test_env_passes_check_env_through_the_resolver(files, env_class, strategy):
    fam = resolve_env(_id(files, env_class, snapshot=strategy))
    report = check_env(fam.make_env(), fam.load_tasks(3, seed=0), make_env=fam.make_env,
                       actions=lambda task: CASES[env_class], branch_actions=["<code>1</code>", "#### 3"])
    assert report.snapshot_strategy == strategy
    for check in ("snapshot_roundtrip", "branch_isolation", "snapshot_pickle_process"):
        assert report.passed[check] >= 6, check  # 3 tasks, several turns each
    assert ("replay_deterministic" in report.passed) == (strategy == "replay")


def _task(fam, answer):
    from environments.ecosystems.skyrl import read_tasks

    return next(t for t in read_tasks(fam.loader_kwargs["path"], fam.env_kwargs["env_class"]) if t.answer == answer)


@pytest.mark.parametrize("action", ["so #### 7", "so #### 8", "seven"])
def test_gsm8k_rewards_are_skyrls_compute_score(files, action):
    from skyrl_gym.envs.gsm8k.utils import compute_score

    single = resolve_env(_id(files, "gsm8k"))
    env = single.make_env().unwrapped
    obs, _ = env.reset(options={"task": _task(single, "7")})
    assert [m.role for m in obs] == ["system", "user"] and "Tom has 3 apples" in obs[1].content
    assert env.step(action)[1:4] == (compute_score(action, "7"), True, False)

    multi = resolve_env(_id(files, "gsm8k_multi_turn"))
    env = multi.make_env().unwrapped
    env.reset(options={"task": _task(multi, "7")})
    obs, reward, terminated, _, _ = env.step(action)
    assert reward == compute_score(action, "7", method="strict", format_score=0.2 / 3, score=1.0)
    assert terminated == (reward == 1.0) and (obs == []) == terminated


def test_text2sql_reward_is_skyrls_sql_score_on_a_local_database(files):
    from pathlib import Path

    from skyrl_gym.envs.sql.utils import compute_score_single

    fam = resolve_env(_id(files, "text2sql"))
    db_file = str(Path(files["db_path"]) / "spider/database/concert_singer/concert_singer.sqlite")
    for task, expected in [(_task(fam, "SELECT count(*) FROM singer"), 1.0),
                           (_task(fam, "SELECT max(age) FROM singer"), 0.0)]:
        env = fam.make_env().unwrapped
        env.reset(options={"task": task})
        obs, reward, terminated, _, _ = env.step(SQL_RIGHT[0])
        assert "<observation>" in obs[0].content and " 4\n" in obs[0].content and (reward, terminated) == (0.0, False)
        _, reward, terminated, _, _ = env.step(SQL_RIGHT[1])
        history = SQL_RIGHT[0] + obs[0].content + SQL_RIGHT[1]
        assert terminated and reward == expected == compute_score_single(history, task.answer, db_file)


@pytest.mark.parametrize("env_class", ["gsm8k", "gsm8k_multi_turn", "text2sql", data.ENV_ID])
def test_hostile_actions_do_not_raise(files, env_class):
    fam = resolve_env(_id(files, env_class))
    env = fam.make_env().unwrapped
    task = fam.load_tasks(1, seed=0)[0]
    env.reset(options={"task": task})
    obs, reward, terminated, truncated, info = env.step(HOSTILE)
    assert isinstance(reward, float) and all(isinstance(m.content, str) for m in obs)
    env.reset(options={"task": task})
    assert isinstance(env.step(CASES.get(env_class, ["#### 1"])[0])[1], float)


def test_our_max_turns_reaches_the_env_as_extras(files):
    fam = resolve_env(_id(files, "gsm8k_multi_turn", max_turns=2))
    env = fam.make_env().unwrapped
    env.reset(options={"task": fam.load_tasks(1, seed=0)[0]})
    obs, _, terminated, truncated, _ = env.step("#### 0")
    assert "Now provide only the final numeric answer" in obs[0].content  # the env counts 2 turns, not 3
    assert env.step("#### 0")[2:4] == (True, False)


def test_load_tasks_reads_parquet_and_jsonl_alike_seeded_and_bounded(files, tmp_path):
    from environments.ecosystems.skyrl import load_tasks

    jsonl = load_tasks(4, seed=3, path=data.write_jsonl(tmp_path / "gsm8k.jsonl", data.gsm8k_rows("gsm8k")),
                       env_class="gsm8k")
    parquet = load_tasks(4, seed=3, path=files["gsm8k"], env_class="gsm8k")
    assert [(t.id.split("/")[1], t.prompt, t.answer, dict(t.metadata)) for t in jsonl] == \
        [(t.id.split("/")[1], t.prompt, t.answer, dict(t.metadata)) for t in parquet]
    assert [t.id for t in load_tasks(4, seed=3, path=files["gsm8k"])] == [t.id for t in parquet]
    assert parquet[0].metadata["extras"]["reward_spec"]["ground_truth"] == parquet[0].answer
    assert parquet[0].source == "openai/gsm8k"
    with pytest.raises(ValueError, match=r"n must be in \[0, 4\]"):
        load_tasks(5, path=files["gsm8k"])
    with pytest.raises(ValueError, match=r"no row for env_class 'text2sql' \(its rows name \['gsm8k'\]\)"):
        load_tasks(1, path=files["gsm8k"], env_class="text2sql")
    with pytest.raises(ValueError, match=r"skyrl:gsm8k needs a dataset: give path="):
        resolve_env("skyrl:gsm8k").load_tasks(1)


def test_unknown_names_and_options_are_one_line_with_did_you_mean(files):
    cases = [("skyrl:gsm8k_multiturn", {}, {}, r"not a registered skyrl-gym env class; did you mean gsm8k_multi_turn"),
             (f"skyrl:gsm8k?pth={files['gsm8k']}", {}, {}, r"\['pth'\]; did you mean path"),
             ("skyrl:gsm8k?env_confg.db_path=/x", {}, {}, r"did you mean env_config"),
             ("skyrl:gsm8k", {"max_turn": 2}, {}, r"\['max_turn'\]; did you mean max_turns"),
             ("skyrl:gsm8k", {}, {"paht": "x"}, r"\['paht'\]; did you mean path")]
    for name, env_kwargs, task_kwargs, pattern in cases:
        with pytest.raises(ValueError, match=pattern) as err:
            resolve_env(name, env_kwargs, task_kwargs)
        assert "\n" not in str(err.value)


def test_a_task_of_another_env_class_is_refused_at_reset(files):
    env = resolve_env(_id(files, "gsm8k")).make_env().unwrapped
    sql_task = resolve_env(_id(files, "text2sql")).load_tasks(1)[0]
    with pytest.raises(ValueError, match=r"is for skyrl env_class 'text2sql', this env runs 'gsm8k'"):
        env.reset(options={"task": sql_task})
    obs, _ = env.reset(options={"task": Task(id="hand/1", prompt="What is 3 + 4?", answer="7")})
    assert [(m.role, m.content) for m in obs] == [("user", "What is 3 + 4?")]
    assert env.step("#### 7")[1] == 1.0  # a hand-made Task's answer is the ground truth


def test_an_env_registered_only_by_entry_point_is_registered_where_it_is_made():
    import skyrl_gym

    from environments.ecosystems.skyrl import SkyRLEnv

    env = SkyRLEnv("ecosystem_vault_elsewhere", entry_point="ecosystem_envs_skyrl:VaultEnv")
    try:
        env.reset(options={"task": Task(id="v/1", prompt="Open the vault.", answer="13")})
        assert "ecosystem_vault_elsewhere" in skyrl_gym.registry
        assert env.step("<code>13</code>")[1:3] == (1.0, True)
    finally:
        skyrl_gym.registry.pop("ecosystem_vault_elsewhere", None)


def test_the_user_envs_global_randomness_stays_private(files):
    import random

    fam = resolve_env(_id(files, data.ENV_ID))
    task = fam.load_tasks(1, seed=0)[0]

    def hints(env, other=None):
        env.reset(options={"task": task}, seed=4)
        out = []
        for guess in ["<code>1</code>", "<code>20</code>"] * 2:
            out.append(env.step(guess)[0][0].content)
            if other is not None:
                other.step(guess)  # another env's draws in between
                random.random()  # and the process's own
        return out

    alone = hints(fam.make_env().unwrapped)
    other = fam.make_env().unwrapped
    other.reset(options={"task": task}, seed=99)
    outside = random.getstate()
    assert hints(fam.make_env().unwrapped, other) == alone
    random.setstate(outside)
    before = random.getstate()
    hints(fam.make_env().unwrapped)
    assert random.getstate() == before  # the env's draws never reach the process


def test_available_lists_built_ins_and_plugins():
    from environments.ecosystems.skyrl import available

    expected = {"skyrl:gsm8k", "skyrl:gsm8k_multi_turn", "skyrl:text2sql", "skyrl:search", f"skyrl:{data.ENV_ID}"}
    assert expected <= set(available())


def test_importing_the_adapter_imports_no_skyrl_gym():
    code = ("import sys, environments.ecosystems.skyrl as m; assert m.PACKAGE == 'skyrl-gym'; "
            "assert 'skyrl_gym' not in sys.modules and 'pandas' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_conversation_that_is_not_a_list_is_refused_before_it_is_read():
    from environments.ecosystems.skyrl import _messages

    endless = ({"role": "user", "content": str(i)} for i in range(10**12))  # read to the end, it would never stop
    with pytest.raises(TypeError, match="step observations must be a list .* got generator"):
        _messages(endless, "step observations")
    assert [m.content for m in _messages(({"role": "user", "content": "a"},), "x")] == ["a"]
