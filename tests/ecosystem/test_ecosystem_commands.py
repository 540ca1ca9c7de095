"""Other ecosystems' envs in the commands a user runs: bench on a multi-turn GEM game with
SmolLM2-135M, train one step on a reasoning-gym dataset, and the envs listing."""

from __future__ import annotations

import json

from trace_gym import cli


def test_bench_env_runs_a_multi_turn_gem_game_with_smollm2(capsys, tmp_path, smollm2_path):
    # two prompts, 12 tokens a turn (SmolLM2's \boxed{} guesses fit), up to 3 turns: still several turns an
    # episode (a tiny random model would end each at its first, unparsable, guess)
    code = cli.main(["bench", "--env", "gem:game:GuessTheNumber-v0-easy", "--env-kwargs", '{"few_shot": true}',
                     "--policy", str(smollm2_path), "--engine", "hf", "--strategies", "uniform,trace",
                     "--candidates", "2", "--root-budget", "2", "--continuations-per-root", "1",
                     "--warmup-budget", "0", "--max-turns", "3", "--max-turn-tokens", "12",
                     "--max-episode-tokens", "2048", "--predictor", "constant", "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "Allocation benchmark on real rollouts: gem:game:GuessTheNumber-v0-easy" in out
    rows = json.loads((tmp_path / "b.json").read_text())["strategies"]
    assert set(rows) == {"uniform", "trace"}
    assert all(r["env_steps"] >= r["rollouts"] > 0 for r in rows.values())  # every rollout stepped the GEM game
    assert any(r["env_steps"] > r["rollouts"] for r in rows.values())  # and some played on past a first guess


def test_train_one_step_on_a_reasoning_gym_dataset(capsys, tmp_path, tiny_model_path):
    run_dir = tmp_path / "run"
    code = cli.main(["train", "env=reasoning_gym:letter_counting?min_words=3&max_words=4", f"policy={tiny_model_path}",
                     'env_kwargs={"few_shot": true}', "predictor=constant", "steps=1", "candidates=4",
                     "root_budget=2", "group_size=2", "strategy=trace", "continuations_per_root=1", "max_turns=1",
                     "max_turn_tokens=8", "max_episode_tokens=1024", "progress=false", "eval_every=0",
                     "eval_at_start=false", "engine=hf", f"run_dir={run_dir}"])
    assert code == 0, capsys.readouterr().err[-2000:]
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["step"] == 1


def test_envs_lists_every_ecosystem(capsys):
    assert cli.main(["envs", "--ecosystem", "reasoning_gym"]) == 0
    out = capsys.readouterr().out
    assert "reasoning_gym:letter_counting" in out and "... " not in out.split("reasoning_gym: ", 1)[1][:50]
    assert cli.main(["envs"]) == 0
    out = capsys.readouterr().out
    for prefix in ("gem:", "skyrl:", "verifiers:", "openenv:", "reasoning_gym:"):
        assert f"  {prefix} " in out
    assert "gem:game:GuessTheNumber-v0-easy" in out and "trace-gym envs --ecosystem gem" in out
    assert cli.main(["envs", "--ecosystem", "gemm"]) == 2
    assert "did you mean gem" in capsys.readouterr().err
