"""A user's own env and strategy plug into every command, with no edit to the library.

A throwaway plugin distribution is written at test time (a package plus a dist-info
folder with its entry points) and put on ``PYTHONPATH``, exactly as ``pip install`` of
a package would make it visible; the commands run in fresh interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLUGIN_MODULE = textwrap.dedent('''
    """A tiny plugin: an env that asks for a number back, and a strategy."""
    import re

    import gymnasium
    import numpy as np

    from trace_gym.api import (ChatObservation, Message, Snapshot, Strategy, Task, TextAction, fixed_groups,
                               freeze, rng_from_state, rng_state, task_from_options, thaw)


    def load_tasks(n, seed=0, high=9):
        rng = np.random.default_rng(seed)
        return [Task(id=f"echo/{seed}/{i}", prompt=f"Reply with the number {int(x)}.", answer=int(x))
                for i, x in enumerate(rng.integers(0, high + 1, size=n))]


    class EchoEnv(gymnasium.Env):
        metadata = {"render_modes": []}
        snapshot_mode = "state"

        def __init__(self, max_turns=2):
            self.max_turns = max_turns
            self.action_space = TextAction(max_length=1024)
            self.observation_space = ChatObservation()
            self._state = None

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            task = task_from_options(options, load_tasks(4), self.np_random)
            self._state = (int(task.answer), 0)
            return [Message("system", "Answer with a number."), Message("user", task.prompt)], {"task_id": task.id}

        def step(self, action):
            answer, turn = self._state
            turn += 1
            self._state = (answer, turn)
            numbers = re.findall(r"-?\\d+", action)
            if numbers and int(numbers[-1]) == answer:
                return [Message("user", "right")], 1.0, True, False, {}
            return [Message("user", "try again")], 0.0, False, turn >= self.max_turns, {}

        def close(self):
            self._state = None

        def snapshot(self):
            return Snapshot("EchoEnv", "state", self._state[1] if self._state else 0,
                            freeze((self._state, rng_state(self.np_random))))

        def restore(self, snapshot):
            self._state, rng = thaw(snapshot.state)
            self._np_random = rng_from_state(rng)


    class HalfGreedy:
        """Groups of 4 on the prompts predicted most likely to succeed."""

        def allocate(self, values, budget, rng):
            order = np.argsort(-np.asarray(values), kind="stable")
            return fixed_groups(order, budget, 4, len(values))


    greedy_half = Strategy(HalfGreedy(), description="plugin: groups of 4 on the likeliest prompts")


    def every_turn_counts(tree, *, eps=1e-6, std_normalize=True):
        """Plugin estimator: advantage 1 on every node (a contrast-free baseline)."""
        return {node.id: 1.0 for node in tree.nodes[1:]}
''')

UNINSTALLED_MODULE = textwrap.dedent('''
    """Not installed: registers itself on import (--plugin echo_local)."""
    from trace_gym.api import register_env, register_estimator, register_strategy
    from echo_plugin import HalfGreedy, Strategy, every_turn_counts, load_tasks

    register_env("EchoLocal-v0", "echo_plugin:EchoEnv", task_loader=load_tasks)
    register_strategy("local_greedy", Strategy(HalfGreedy(), description="registered by --plugin"))
    register_estimator("local_every_turn", every_turn_counts)
''')


def write_plugin(site: Path, *, installed: bool = True, broken: bool = False) -> None:
    site.mkdir(parents=True, exist_ok=True)
    (site / "echo_plugin.py").write_text(PLUGIN_MODULE)
    (site / "echo_local.py").write_text(UNINSTALLED_MODULE)
    if installed:
        dist = site / "echo_plugin-0.1.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 0.1\n")
        entry_points = ("[trace_gym.envs]\nEcho-v0 = echo_plugin:EchoEnv\n\n"
                        "[trace_gym.tasks]\nEcho-v0 = echo_plugin:load_tasks\n\n"
                        "[trace_gym.train.advantages]\nevery_turn = echo_plugin:every_turn_counts\n\n"
                        "[trace_gym.strategies]\ngreedy_half = echo_plugin:greedy_half\n")
        if broken:
            entry_points += "broken_one = no_such_module_xyz:thing\n"
        (dist / "entry_points.txt").write_text(entry_points)


def run(site: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=site, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    path = tmp_path_factory.mktemp("site")
    write_plugin(path)
    return path


@pytest.fixture(scope="module")
def envs_listing(site):
    """One ``envs`` run (~10 s: it lists every ecosystem) read by two tests: the installed
    plugin's entry-point env and the env ``--plugin=echo_local`` (before the subcommand)
    registers, both in the list."""
    return run(site, "-m", "trace_gym.cli", "--plugin=echo_local", "envs")


@pytest.fixture(scope="module")
def sim_beside_builtins(site):
    """One ``bench --sim`` run read by three tests: the installed plugin's strategy beside the
    built-ins and named as the baseline, and the strategy ``--plugin echo_local`` registers."""
    return run(site, "-m", "trace_gym.cli", "bench", "--sim", "--plugin", "echo_local", "--strategies",
               "uniform,trace,greedy_half,local_greedy", "--seeds", "2", "--steps", "2", "--pool-size", "512",
               "--candidates", "128", "--root-budget", "64", "--baseline", "greedy_half")


def test_envs_and_strategies_list_the_plugin(site, envs_listing):
    out = envs_listing
    assert out.returncode == 0, out.stderr
    assert "trace_gym/Echo-v0" in out.stdout.split()
    out = run(site, "-m", "trace_gym.cli", "strategies")
    assert out.returncode == 0, out.stderr
    assert "greedy_half" in out.stdout and "groups of 4 on the likeliest prompts" in out.stdout


def test_gymnasium_make_after_import_trace_gym_without_importing_the_plugin_first(site):
    code = ("import sys, gymnasium, trace_gym\n"
            "assert 'echo_plugin' not in sys.modules, 'import trace_gym imported the plugin'\n"
            "env = gymnasium.make('trace_gym/Echo-v0')\n"
            "obs, info = env.reset(seed=0)\n"
            "print(type(env.unwrapped).__name__, obs[-1].content)\n")
    out = run(site, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("EchoEnv Reply with the number")


def test_bench_sim_runs_the_plugin_strategy_beside_the_builtins(sim_beside_builtins):
    out = sim_beside_builtins
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip() for line in out.stdout.splitlines() if line.startswith("| ")}
    assert {"uniform", "trace", "greedy_half"} <= rows
    assert "group size 8 (applied to uniform)" in out.stdout  # greedy_half declares no group size


def test_a_plugin_strategy_gets_paired_verdicts_against_uniform_and_trace_on_a_shipped_bank(site, sim_beside_builtins):
    # beta_posterior: a predictor that learns, without the embedding predictor's ~10 s of
    # sentence-transformers import (what is tested is the plugin's pairing, not the predictor)
    out = run(site, "-m", "trace_gym.cli", "bench", "--bank", "math_python_smollm2", "strategies=uniform,trace,greedy_half",
              "seeds=3", "steps=1", "candidates=32", "oracle_upper_bound=false", "predictor=beta_posterior",
              "--json", str(site / "b.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((site / "b.json").read_text())
    pairs = {(e["a"], e["b"]): e for e in res["paired"]}
    for other in ("uniform", "trace"):  # the plugin is paired with the baseline and with TRACE, on every metric
        entry = pairs[("greedy_half", other)]
        assert all(entry[k]["n"] == 3 for k in ("effective_ratio", "mixed_prompts", "mixed_per_1k_tokens"))
        assert f"| greedy_half - {other}" in out.stdout
    # --baseline names another strategy by role: its pairs and checks follow it
    out = sim_beside_builtins
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trace effective ratio above greedy_half" in out.stdout and "| uniform - greedy_half" in out.stdout


@pytest.mark.slow  # ~10 s; test_the_same_with_plugin_module_for_an_uninstalled_module covers bench --env on a plugin
# env with a plugin strategy, test_a_plugin_estimator_trains_one_step[entry point] a model run on the entry-point env
def test_bench_env_runs_on_the_plugin_env(site, tiny_model_path):
    out = run(site, "-m", "trace_gym.cli", "bench", "--env", "trace_gym/Echo-v0", "--policy", str(tiny_model_path),
              "--engine", "hf", "--strategies", "uniform,greedy_half", "--candidates", "4", "--root-budget", "4",
              "--continuations-per-root", "0", "--group-size", "2", "--warmup-budget", "0", "--max-turns", "2",
              "--max-turn-tokens", "4", "--max-episode-tokens", "256", "--predictor", "constant",
              "--task-kwargs", '{"high": 3}', "--env-kwargs", '{"max_turns": 2}')
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Allocation benchmark on real rollouts: trace_gym/Echo-v0" in out.stdout
    assert "| greedy_half" in out.stdout


def test_the_same_with_plugin_module_for_an_uninstalled_module(tmp_path, tiny_model_path, envs_listing,
                                                                sim_beside_builtins):
    assert envs_listing.returncode == 0, envs_listing.stderr
    assert "trace_gym/EchoLocal-v0" in envs_listing.stdout.split()  # `--plugin=echo_local envs`
    out = sim_beside_builtins  # `bench --sim --plugin echo_local --strategies ...,local_greedy`
    assert out.returncode == 0 and "| local_greedy" in out.stdout, out.stderr
    write_plugin(tmp_path, installed=False)
    out = run(tmp_path, "-m", "trace_gym.cli", "strategies")
    assert "local_greedy" not in out.stdout  # nothing registered without --plugin
    out = run(tmp_path, "-m", "trace_gym.cli", "strategies", "--plugin", "echo_local")
    assert out.returncode == 0 and "local_greedy" in out.stdout, out.stderr
    out = run(tmp_path, "-m", "trace_gym.cli", "bench", "--env", "EchoLocal-v0", "--plugins", "echo_local",
              "--policy", str(tiny_model_path), "--engine", "hf", "--strategies", "local_greedy", "--candidates",
              "4", "--root-budget", "4", "--continuations-per-root", "0", "--warmup-budget", "0", "--max-turns",
              "1", "--max-turn-tokens", "4", "--max-episode-tokens", "256", "--predictor", "constant")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| local_greedy" in out.stdout


TRAIN_ONE_STEP = ["train", "env=trace_gym/Echo-v0", "predictor=constant", "steps=1", "candidates=4", "root_budget=2",
                  "group_size=2", "strategy=uniform", "max_turns=2", "max_turn_tokens=4", "max_episode_tokens=256",
                  "progress=false", "eval_every=0", "engine=hf", 'env_kwargs={"max_turns": 2}']


def metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.parametrize("how", [
    "entry point",
    # ~10 s more: test_a_plugin_module_estimator_is_a_train_choice checks that --plugin registers the estimator
    # as a train choice, and the entry-point variant trains a step with a plugin's estimator from that table
    pytest.param("--plugin", marks=pytest.mark.slow),
])
def test_a_plugin_estimator_trains_one_step(tmp_path, tiny_model_path, how):
    """An estimator from a throwaway plugin is listed and trains a real step: it gives every
    node advantage 1, so every node is trained, where the built-in GRPO gives the tiny
    model's all-failed groups exactly 0 (nothing trained)."""
    write_plugin(tmp_path, installed=how == "entry point")
    name, extra = ("every_turn", []) if how == "entry point" else ("local_every_turn", ["--plugin", "echo_local"])
    if how == "--plugin":  # the uninstalled plugin registers its own env id
        extra += ["env=trace_gym/EchoLocal-v0"]
    listed = run(tmp_path, "-m", "trace_gym.cli", "estimators", *extra[:2])
    assert listed.returncode == 0 and name in listed.stdout, listed.stderr
    common = [*TRAIN_ONE_STEP, f"policy={tiny_model_path}", *extra]
    out = run(tmp_path, "-m", "trace_gym.cli", *common, f"advantage={name}", f"run_dir={tmp_path / 'mine'}")
    assert out.returncode == 0, out.stderr[-3000:]
    mine = metrics(tmp_path / "mine")
    assert mine["step"] == 1 and mine["accuracy"] == 0.0  # the tiny random policy never echoes the number
    assert mine["nodes_with_advantage"] > 0 and mine["policy/trained_tokens"] > 0
    out = run(tmp_path, "-m", "trace_gym.cli", *common, "advantage=grpo", f"run_dir={tmp_path / 'grpo'}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert metrics(tmp_path / "grpo")["nodes_with_advantage"] == 0
    out = run(tmp_path, "-m", "trace_gym.cli", *common, "advantage=every_tern", f"run_dir={tmp_path / 'typo'}")
    assert out.returncode == 2 and "advantage must be one of" in out.stderr


def test_a_plugin_module_estimator_is_a_train_choice(tmp_path, tiny_model_path):
    """``--plugin`` of an uninstalled module registers its estimator for ``estimators`` and for
    ``train``'s ``advantage=`` (a mistyped name is refused naming it, before any model loads)."""
    write_plugin(tmp_path, installed=False)
    listed = run(tmp_path, "-m", "trace_gym.cli", "estimators", "--plugin", "echo_local")
    assert listed.returncode == 0 and "local_every_turn" in listed.stdout, listed.stderr
    out = run(tmp_path, "-m", "trace_gym.cli", *TRAIN_ONE_STEP, f"policy={tiny_model_path}", "--plugin", "echo_local",
              "env=trace_gym/EchoLocal-v0", "advantage=local_every_tern", f"run_dir={tmp_path / 'typo'}")
    assert out.returncode == 2 and "advantage must be one of" in out.stderr
    assert "'local_every_turn'" in out.stderr and "did you mean local_every_turn" in out.stderr


def test_a_broken_plugin_is_one_line_and_the_builtins_still_work(tmp_path):
    write_plugin(tmp_path, broken=True)
    out = run(tmp_path, "-m", "trace_gym.cli", "strategies")
    assert out.returncode == 0
    assert "greedy_half" in out.stdout and "trace" in out.stdout
    lines = [line for line in out.stderr.splitlines() if "broken_one" in line]
    assert len(lines) == 1 and "no_such_module_xyz" in lines[0] and "built-ins still work" in lines[0]
    out = run(tmp_path, "-m", "trace_gym.cli", "strategies", "--plugin", "no_such_plugin_module")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if "no_such_plugin_module" in line]
    assert lines == ["trace-gym: error: --plugin no_such_plugin_module failed: ModuleNotFoundError: No module named "
                     "'no_such_plugin_module' (not importable from the current folder or sys.path)"]


def test_unknown_env_names_the_choices(site):
    out = run(site, "-m", "trace_gym.cli", "bench", "--env", "Nope-v0", "--policy", "x")
    assert out.returncode == 2
    assert "unknown env 'Nope-v0'" in out.stderr and "math_python" in out.stderr


def test_all_zero_warning_and_transcript_dump(tiny_engine, tmp_path):
    from trace_gym.bench.report import format_bench
    from trace_gym.bench.env import run_env_bench
    from trace_gym.bench.config import EnvBenchConfig
    from trace_gym.registry import resolve_env
    from trace_gym.strategies import shaped_strategies

    # a tiny random model never finds the secret: every reward is 0
    cfg = EnvBenchConfig(env="guess_number", candidates=3, root_budget=2, continuations_per_root=2, group_size=2,
                         warmup_budget=0, max_turns=2, max_turn_tokens=6, max_episode_tokens=512,
                         predictor="constant", strategies=("trace",), dump_episodes=2)
    table = shaped_strategies(cfg.strategies, group_size=2, continuations_per_root=2)
    said = []
    res = run_env_bench(cfg, table, resolve_env("guess_number"), engine=tiny_engine, out_dir=str(tmp_path),
                        say=said.append)
    assert any("rollouts failed (reward 0, below the success threshold 0.5): no prompt is mixed" in w
               for w in res["warnings"])
    assert any(s.startswith("WARNING: rep 1, trace") for s in said)
    assert "### Warnings" in format_bench(res)
    episodes = [json.loads(line) for line in (tmp_path / "episodes-trace.jsonl").read_text().splitlines()]
    assert len(episodes) == 2
    for ep in episodes:
        assert ep["reward"] == 0.0 and ep["prompt"].startswith("I am thinking of an integer")
        assert ep["turns"] and all("action" in t and "observation" in t for t in ep["turns"])
    with pytest.raises(ValueError, match="needs an output folder"):
        run_env_bench(cfg, table, resolve_env("guess_number"), engine=tiny_engine)


def test_reward_warning_is_silent_when_outcomes_mix():
    from trace_gym.step.learning import reward_warning
    from trace_gym.tree import ROOT, RolloutTree

    tree = RolloutTree("t", (1, 2))
    for reward in (0.0, 1.0):
        branch = tree.start_branch(ROOT)
        tree.add_turn(ROOT, branch=branch, policy_token_ids=(3,), reward=reward, terminal=True)
    assert reward_warning([tree]) is None
    won = RolloutTree("w", (1, 2))
    won.add_turn(ROOT, branch=won.start_branch(ROOT), policy_token_ids=(3,), reward=1.0, terminal=True)
    assert "every one of the 1 rollouts succeeded (reward 1)" in reward_warning([won])


def test_the_trace_gym_script_finds_a_plugin_module_in_the_current_folder(tmp_path):
    """The installed script's sys.path[0] is its bin folder, not the current one: --plugin
    puts the current folder on the path, as `python -m` does, so no PYTHONPATH is needed."""
    script = Path(sys.executable).with_name("trace-gym")
    if not script.is_file():
        pytest.skip("the trace-gym script is not installed in this environment")
    write_plugin(tmp_path, installed=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(script), "strategies", "--plugin", "echo_local"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "local_greedy" in out.stdout, out.stderr
