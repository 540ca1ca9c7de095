"""The training run's plumbing without a model: config loading and errors, the run directory's
commit/resume rules, the data cursor, the held-out split, and every shipped config's --dry-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import os

import pytest


from run_dir_checks import assert_refused_untouched
from trace_gym.runs.run_dir import RunDir
from trace_gym.env.datafiles import split_tasks
from trace_gym.train.config import TrainConfig
from trace_gym.config import load_config
from trace_gym.train.loop import TaskCursor, config_differences
from trace_gym.types import Task

ROOT = Path(__file__).resolve().parents[2]


def test_config_yaml_overrides_and_trainer_section(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("strategy: uniform\nsteps: 3\ntrainer:\n  lr: 2.0e-5\n  clip_high: 0.28\n")
    cfg = load_config(TrainConfig, f, {"steps": "5", "trainer.loss_aggregation": "seq-mean-token-mean"})
    assert (cfg.strategy, cfg.steps) == ("uniform", 5)
    assert (cfg.trainer.lr, cfg.trainer.clip_high, cfg.trainer.loss_aggregation) == (2e-5, 0.28, "seq-mean-token-mean")
    assert cfg.nominal_budget == 16.0


@pytest.mark.parametrize("overrides, message", [
    ({"stepz": "3"}, r"unknown key\(s\) \['stepz'\]"),
    ({"steps": "three"}, "steps: expected an int, got 'three'"),
    ({"trainer.lrr": "1"}, r"\(trainer\): unknown key\(s\) \['lrr'\]"),
    ({"trainer.loss_aggregation": "sum"}, "loss_aggregation must be one of"),
    ({"advantage": "ppo"}, "advantage must be one of"),
])
def test_bad_keys_and_values_name_themselves(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(TrainConfig, None, overrides)


def test_cli_errors_are_one_line_before_any_model_loads(tmp_path):
    for args, needle in ((["stepz=3"], "unknown key"), (["strategy=best"], "unknown strategy 'best'"),
                         (["env=nowhere"], "unknown env 'nowhere'")):
        out = subprocess.run([sys.executable, "-m", "trace_gym.cli", "train", f"run_dir={tmp_path / 'r'}", *args],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0], out.stderr
        assert not (tmp_path / "r").exists()  # nothing was written, nothing loaded


def test_config_differences_ignore_resumable_keys():
    from trace_gym.config import to_yaml

    a = TrainConfig()
    b = load_config(TrainConfig, None, {"progress": "false", "steps": "9", "trainer.lr": "3e-6"})
    assert config_differences(to_yaml(a), to_yaml(b)) == ["trainer.lr: 1e-06 -> 3e-06"]


def test_a_run_written_before_a_key_existed_resumes_while_the_key_keeps_its_default():
    """A run directory from an older version lacks newer keys (here predictor_kwargs and
    trainer.lr): absent means the default, so only a non-default new value is a change."""
    import yaml

    from trace_gym.config import to_yaml

    old = yaml.safe_load(to_yaml(TrainConfig()))
    old.pop("predictor_kwargs")
    old["trainer"].pop("lr")
    stored = yaml.safe_dump(old)
    assert config_differences(stored, to_yaml(TrainConfig())) == []
    changed = load_config(TrainConfig, None, {"predictor_kwargs": '{"device": "cpu"}'})
    assert config_differences(stored, to_yaml(changed)) == ["predictor_kwargs: {} -> {'device': 'cpu'}"]


def rec(step):
    return {"step": step, "reward": step / 10}


def test_rundir_commit_and_resume_rules(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.start("a: 1\n") is None
    write = lambda folder: (folder / "weights.bin").write_bytes(b"x")  # noqa: E731
    run.commit(1, rec(1), write)
    run.commit(2, rec(2), None)  # not checkpointed: reruns after a crash
    run.commit(3, rec(3), write, keep=2)
    run.commit(4, rec(4), None)
    # a kill here: steps 1-4 logged, checkpoints 1 and 3
    run.close()  # (the killed process's lock dies with it)
    resume = RunDir(tmp_path / "run").start("a: 1\n")
    assert resume.step == 3 and (resume.path / "weights.bin").exists()
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]  # step 4 reruns, so its line is dropped
    # killed between the checkpoint rename and the metrics append: the line comes back from the checkpoint
    run.commit(4, rec(4), write, keep=0)
    lines = run.metrics_path.read_text().splitlines()
    run.metrics_path.write_text("\n".join(lines[:-1]) + "\n" + '{"step": 4, "rew')  # and a torn tail
    (run.checkpoints / ".tmp-step-5-999").mkdir()  # a half-written checkpoint of the next step
    resume = run.start("a: 1\n")
    assert resume.step == 4 and [r["step"] for r in run.read_metrics()] == [1, 2, 3, 4]
    assert run.read_metrics()[-1] == rec(4)
    assert not list(run.checkpoints.glob(".tmp-*"))
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-1", "step-3", "step-4"]
    with pytest.raises(ValueError, match="another config"):
        run.start("a: 2\n")
    with pytest.raises(ValueError, match=r"no checkpoint for step 2; it has \[1, 3, 4\]"):
        run.checkpoint_path(2)


def test_a_second_run_on_a_locked_run_dir_is_refused_naming_the_holder(tmp_path):
    first = RunDir(tmp_path / "run")
    first.start("a: 1\n")
    with pytest.raises(ValueError, match=rf"is in use by pid {os.getpid()} on .* since 20"):
        RunDir(tmp_path / "run").start("a: 1\n")
    first.close()
    assert RunDir(tmp_path / "run").start("a: 1\n") is None  # free again once the holder is gone


def test_a_locked_run_dir_is_refused_across_processes_and_freed_when_the_holder_dies(tmp_path):
    import subprocess
    import sys
    import time

    code = ("import sys, time; from trace_gym.runs.run_dir import RunDir; run = RunDir(sys.argv[1]); run.start('a: 1\\n'); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=rf"in use by pid {holder.pid} "):
            RunDir(tmp_path / "run").start("a: 1\n")
    finally:
        holder.kill()
        holder.wait()
    deadline = time.time() + 10
    RunDir(tmp_path / "run").start("a: 1\n")  # SIGKILL released the lock
    assert time.time() < deadline


def _checkpointed_run(path, steps, weights=b"w" * 64):
    run = RunDir(path)
    run.start("a: 1\n")
    for s in range(1, steps + 1):
        run.commit(s, rec(s), lambda f: ((f / "policy").mkdir(), (f / "policy" / "model.safetensors").write_bytes(weights),
                                         (f / "state.json").write_text('{"step": %d}' % s)), keep=0)
    run.close()
    return run


@pytest.mark.parametrize("damage, reason", [
    (lambda ck: ck.mkdir(), "no manifest.json"),
    (lambda ck: (ck.mkdir(), (ck / "state.json").write_text("{}")), "no manifest.json"),
    (lambda ck: ck.joinpath("policy", "model.safetensors").write_bytes(b"w" * 10), "model.safetensors has 10 bytes"),
    (lambda ck: ck.joinpath("state.json").write_text('{"step": 0}'), "state.json differs from the manifest"),
    (lambda ck: ck.joinpath("policy", "model.safetensors").unlink(), "model.safetensors is missing"),
    (lambda ck: ck.joinpath("manifest.json").write_text("garbage"), "manifest.json is unreadable"),
])
def test_resume_refuses_a_touched_newest_checkpoint_moves_nothing_and_goes_on_once_the_user_did(tmp_path, damage,
                                                                                              reason):
    """A step folder that fails its manifest was not left so by the run (it renames each
    checkpoint into place whole): resume names it and what differs, and moves nothing; once
    the user moves it aside, resume takes the newest left."""
    run = _checkpointed_run(tmp_path / "run", 2)
    newest = run.checkpoints / ("step-9" if "no manifest" in reason else "step-2")
    damage(newest)
    expected = 2 if newest.name == "step-9" else 1
    again = RunDir(tmp_path / "run")
    metrics = again.metrics_path.read_bytes()
    assert_refused_untouched(again.path, int(newest.name[5:]), reason, lambda: again.start("a: 1\n"),
                             then=f"step-{expected} is then the newest")
    assert again.metrics_path.read_bytes() == metrics  # the refusal rewrote nothing
    newest.rename(tmp_path / "aside")
    resume = again.start("a: 1\n")
    assert resume.step == expected and resume.path == run.checkpoints / f"step-{expected}"
    assert [r["step"] for r in again.read_metrics()] == list(range(1, expected + 1))


def test_a_run_dir_an_older_eval_wrote_into_is_refused_with_what_to_remove_then_resumes(tmp_path):
    """The run dirs of issue 41: eval's old memo in step-2/policy/ (its resume moved step-2 aside)."""
    run = _checkpointed_run(tmp_path / "run", 2)
    memo = run.checkpoints / "step-2" / "policy" / ".trace_gym_weights_hash.json"
    memo.write_text('{"version": 2, "stamp": [], "sha256": "0"}')
    again = RunDir(tmp_path / "run")
    assert_refused_untouched(again.path, 2, "policy/.trace_gym_weights_hash.json is not listed in manifest.json (the "
                             "weights-hash memo eval wrote there before issue 41: safe to remove)",
                             lambda: again.start("a: 1\n"), then="step-1 is then the newest")
    memo.unlink()
    assert again.start("a: 1\n").step == 2


def test_a_touched_only_checkpoint_is_refused_too_naming_a_fresh_start(tmp_path):
    run = _checkpointed_run(tmp_path / "run", 1)
    (run.checkpoints / "step-1" / "policy" / "notes.txt").write_text("mine")
    again = RunDir(tmp_path / "run")
    assert_refused_untouched(again.path, 1, "policy/notes.txt is not listed in manifest.json",
                             lambda: again.start("a: 1\n"), then="no checkpoint is then left: step 1 next")
    (run.checkpoints / "step-1" / "policy" / "notes.txt").unlink()  # undone: the run resumes where it was
    assert again.start("a: 1\n").step == 1


def test_checkpoint_path_names_the_damaged_file(tmp_path):
    run = _checkpointed_run(tmp_path / "run", 1)
    (run.checkpoints / "step-1" / "state.json").write_text("{" * 40)
    with pytest.raises(ValueError, match=r"step-1 is not a complete checkpoint: state.json has 40 bytes"):
        run.checkpoint_path(1)


def test_keep_prunes_old_checkpoints(tmp_path):
    run = RunDir(tmp_path)
    run.start("x: 1\n")
    for s in range(1, 5):
        run.commit(s, rec(s), lambda f: None, keep=2)
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["step-3", "step-4"]


def test_task_cursor_epochs_and_resume():
    a = TaskCursor(5, seed=1)
    first = a.take(3) + a.take(3) + a.take(4)
    assert sorted(first[:5]) == list(range(5)) and sorted(first[5:]) == list(range(5))  # each epoch a permutation
    b = TaskCursor(5, seed=1)
    b.take(3)
    state = b.state()
    c = TaskCursor(5, seed=1)
    c.load(json.loads(json.dumps(state)))
    assert c.take(7) == first[3:10]


def test_heldout_split_is_by_prompt_text():
    tasks = [Task(f"t{i}", f"What is {i % 30} + 1?") for i in range(300)]
    held = split_tasks(tasks, "heldout", 0.2)
    train = split_tasks(tasks, "train", 0.2)
    assert len(held) + len(train) == 300 and 0.1 < len(held) / 300 < 0.3
    assert not {t.prompt for t in held} & {t.prompt for t in train}  # same text, same side, whatever the id


def configs():
    return sorted((ROOT / "configs").glob("train_*.yaml")) + sorted((ROOT / "configs" / "paper").glob("*.yaml"))


@pytest.mark.parametrize("path", configs(), ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_shipped_configs_dry_run(path, tmp_path, capsys):
    import yaml

    from trace_gym.cli import main
    from trace_gym.registry import ENV_FAMILIES

    raw = yaml.safe_load(path.read_text()) or {}
    env = raw.get("env", "math_python")
    if env not in ENV_FAMILIES:
        pytest.skip(f"env family {env!r} is not registered yet (the retrieval issue adds wiki_qa)")
    assert main(["train", "--config", str(path), "--dry-run", f"run_dir={tmp_path / 'r'}"]) == 0
    assert not (tmp_path / "r").exists()
    out = capsys.readouterr().out
    if path.parent.name == "paper":  # the paper's separate 0.6B critic, on the GPU in bf16, sized
        assert raw["device"] == "cuda" and raw["trainer"]["ppo_epochs"] == raw["trainer"]["mini_batches"] == 1
        assert "critic: Qwen/Qwen3-0.6B on cuda in bfloat16, backbone trained; 0.60B parameters, 596.1M trainable, " \
               "~4.4 GiB" in out, out
        assert "1 epoch x 1 mini-batch per batch (on-policy)" in out


def test_a_cpu_critic_beside_a_cuda_policy_is_refused_unless_asked(tmp_path, capsys):
    from trace_gym.cli import main

    base = ["train", "--config", "configs/paper/deepscaler_trace.yaml", "--dry-run", f"run_dir={tmp_path / 'r'}"]
    assert main([*base, "predictor_kwargs={}"]) == 2
    err = capsys.readouterr().err
    assert "lm_critic would run on the CPU beside a CUDA policy" in err and len(err.strip().splitlines()) == 1
    assert main([*base, "predictor_kwargs={}", "allow_cpu_critic=true"]) == 0
    assert "critic: Qwen/Qwen3-0.6B on cpu in float32, backbone frozen; 0.60B parameters, 0.0M trainable" \
           in capsys.readouterr().out


def test_critic_plan_counts_the_backbone_it_would_load(tiny_model_path):  # noqa: F811
    from trace_gym.predictor.critic import LMCriticPredictor, critic_plan

    plan = critic_plan(str(tiny_model_path), {"dtype": "bfloat16", "train_backbone": True})
    critic = LMCriticPredictor(str(tiny_model_path), dtype="bfloat16", train_backbone=True)
    n = sum(p.numel() for p in critic.backbone.parameters())
    head = sum(p.numel() for p in critic.head.parameters())
    assert plan.parameters == n and plan.trainable == n + head
    assert plan.memory_bytes == n * 2 * 4 + head * 16  # bf16 weights, grads and two AdamW states; fp32 head x 4
    frozen = critic_plan(str(tiny_model_path), {})
    assert (frozen.dtype, frozen.device, frozen.trainable, frozen.memory_bytes) == ("float32", "cpu", head,
                                                                                      n * 4 + head * 16)
    assert critic_plan("no/such-model", {}).parameters is None


def test_dry_run_checks_predictor_kwargs(tmp_path, capsys):
    from trace_gym.cli import main

    base = ["train", "--config", "configs/train_cpu_trace.yaml", "--dry-run", f"run_dir={tmp_path / 'r'}"]
    assert main([*base, "predictor=lm_critic", 'predictor_kwargs={"dtype": "bfloat16"}']) == 0
    assert "predictor: lm_critic {'dtype': 'bfloat16'}" in capsys.readouterr().out
    assert main([*base, 'predictor_kwargs={"devise": "cuda"}']) == 2
    assert "embedding does not take 'devise'" in capsys.readouterr().err


def test_a_step_that_raises_closes_the_runner_the_engine_and_the_backend(tmp_path, tiny_model_path):  # noqa: F811
    """The loop's ``finally``: a policy update that raises mid-step (planted) still closes
    the step's agent runner, the engine and the backend, in that order, and propagates."""
    from trace_gym.train.backend import InProcessBackend
    from trace_gym.commands.train import resolve_train_setup
    from trace_gym.train.loop import train

    closed: list[str] = []

    def recording(obj, name):
        close = obj.close
        obj.close = lambda: (closed.append(name), close())[1]
        return obj

    class PlantedBackend(InProcessBackend):
        def make_trainer(self, *args, **kwargs):
            trainer = super().make_trainer(*args, **kwargs)

            def step(trees):
                raise RuntimeError("planted: the update failed")

            trainer.step = step
            return trainer

        def make_engine(self, *args, **kwargs):
            return recording(super().make_engine(*args, **kwargs), "engine")

        def make_runner(self, *args, **kwargs):
            return recording(super().make_runner(*args, **kwargs), "runner")

        def close(self):
            closed.append("backend")

    cfg = load_config(TrainConfig, None, {"run_dir": str(tmp_path / "r"), "policy": str(tiny_model_path),
                                   "env": "guess_number", "predictor": "constant", "steps": "1", "candidates": "4",
                                   "root_budget": "2", "max_turns": "1", "max_turn_tokens": "4",
                                   "max_episode_tokens": "256", "progress": "false", "engine": "hf"})
    with pytest.raises(RuntimeError, match="planted"):
        train(cfg, resolve_train_setup(cfg), backend=PlantedBackend())
    assert closed == ["runner", "engine", "backend"]


def test_near_miss_names_get_a_suggestion():
    from trace_gym.train.advantages import get_estimator
    from trace_gym.models import resolve_model
    from trace_gym.predictor.kinds import check_predictor_name
    from trace_gym.train.config import TrainConfig

    with pytest.raises(ValueError, match="did you mean tree_grpo"):
        get_estimator("tree_grp")
    with pytest.raises(ValueError, match="did you mean treerpo"):
        TrainConfig(advantage="treerp")
    with pytest.raises(ValueError, match="did you mean embedding"):
        check_predictor_name("embeding", "text")
    with pytest.raises(FileNotFoundError, match="did you mean smollm2-135m"):
        resolve_model("smollm2-135")
