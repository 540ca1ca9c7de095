"""TRL's ``GRPOTrainer`` on bench_step's single-turn task, alternated with our arms.

The arm runs in a child process (``bench_step.py --trl-child``, :func:`trl_child`) so the
two systems never share a process or run side by side: after each TRL step the child
prints ``STEP <seconds> <reward seconds>`` and waits for a line on stdin, and the parent
(:func:`trl_arm`) runs one round of its own arms in between.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def trl_child(rounds: int, make_arm: Callable[[], Any], first_observations: Callable[[Any, int], list],
              prompts_per_step: int) -> int:
    """TRL's GRPOTrainer on the arm ``make_arm()`` builds (our env grades every completion),
    ``prompts_per_step`` prompts x 4 completions of at most 64 tokens, one warm-up step then
    ``rounds`` timed ones (see the module docstring for the protocol)."""
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback, ProgressCallback
        from trl import GRPOConfig, GRPOTrainer
    except Exception as exc:  # not installed, or does not import
        print(f"NOTRL trl does not import here ({type(exc).__name__}: {str(exc)[:120]})", flush=True)
        return 0
    from trace_gym.models import pull_model, quiet_third_party

    quiet_third_party()
    arm = make_arm()
    prompts = [{"prompt": messages, "task_id": task.id} for task, messages in first_observations(arm, 64)]
    by_id = {t.id: t for t in arm.tasks}
    spent = [0.0]

    def reward(completions, task_id, **_):  # our env's grade of each completion, one env each
        t0 = time.perf_counter()
        scores = []
        for completion, tid in zip(completions, task_id):
            env = arm.setup.make_env()
            try:
                env.reset(seed=0, options={"task": by_id[tid]})
                text = completion[-1]["content"] if isinstance(completion, list) else completion
                scores.append(float(env.step(text)[1]))
            finally:
                env.close()
        spent[0] += time.perf_counter() - t0
        return scores

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            spent[0], self.t0 = 0.0, time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            print(f"STEP {time.perf_counter() - self.t0:.3f} {spent[0]:.3f}", flush=True)
            sys.stdin.readline()  # the parent's round of our arms runs now

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(output_dir=tmp, use_cpu=True, per_device_train_batch_size=prompts_per_step * 4,
                            num_generations=4, max_completion_length=64, temperature=0.7, learning_rate=1e-7,
                            max_steps=rounds + 1, logging_steps=1, report_to="none", save_strategy="no",
                            disable_tqdm=True, bf16=False, dataloader_num_workers=0, seed=0)
        trainer = GRPOTrainer(model=str(pull_model("smollm2-135m", progress=False)), reward_funcs=reward,
                              args=config, train_dataset=Dataset.from_list(prompts), callbacks=[Clock()])
        for quiet in (PrinterCallback, ProgressCallback):  # the parent prints the table
            trainer.remove_callback(quiet)
        trainer.train()
    return 0


def trl_arm(script: str, rounds: int, between: Callable[[], None]) -> list[tuple[float, float]] | str:
    """``(step seconds, of which reward seconds)`` of TRL's ``rounds`` timed steps, run in a
    child process (``script --trl-child``, :func:`trl_child`) alternated with ``between()``
    (one round of our arms) after each; a string says why TRL's arm did not run."""
    child = subprocess.Popen([sys.executable, script, "--trl-child", "--rounds", str(rounds)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    times: list[tuple[float, float]] = []
    try:
        for line in child.stdout:
            if line.startswith("NOTRL "):
                return line[6:].strip()
            if not line.startswith("STEP "):
                continue
            _, seconds, reward = line.split()
            times.append((float(seconds), float(reward)))
            if len(times) > 1:  # after the warm-up step
                between()
            child.stdin.write("go\n")
            child.stdin.flush()
    finally:
        child.stdin.close()
        err = child.stderr.read()
        code = child.wait()
    if code != 0 or len(times) != rounds + 1:
        return f"TRL's run failed (exit {code}): {err.strip().splitlines()[-1:] or ['no output']}"
    return times[1:]
