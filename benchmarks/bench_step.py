"""A whole training step against its lower bound, per strategy and engine, beside TRL's.

One run, every arm alternated round by round (``--rounds``, after one warm-up round), on
SmolLM2-135M on this CPU, with the code ``trace-gym train`` runs
(:func:`trace_gym.train.loop.policy_step`: rollouts and the predictor's update, advantages,
the policy update, the weight sync):

- tasks: **single** (the generated math family, one turn: TRL's job, 4 prompts x 4
  completions of 64 tokens) and **multi** (GuessNumber over 1..8, up to 3 turns of 32 tokens,
  32 prompts a step: ``--multi-prompts``);
- strategies: uniform GRPO (P prompts x 4) and TRACE (2P roots + 4P continuations / 2)
  at the same nominal budget of 4P rollouts. In a multi-turn step TRACE's roots run every
  turn, half as wide as uniform's batch, before a prompt's continuations can be planned
  (they need its roots' rewards); the engines' width curve, printed first, says what that
  half width costs by itself (steep up to 64 wide on this CPU, where the HF engine's
  ``max_batch_rows`` caps a call: hence 32 prompts, TRACE's roots 64 wide; at 16 the HF
  engine's TRACE rate was 0.84x uniform's, vLLM's 1.01x);
- engines: ``hf`` and ``vllm`` (when it imports).

Per arm: generated tok/s (generated tokens / the ledger's generation seconds, both summed
over the rounds: one step's rate swings with its longest completion), update trained tok/s
(summed likewise), median step seconds, and the ratio of the step to
its lower bound on this machine: generated tokens at the engine's peak batch throughput
(the best width of the curve: 8/16/32/64 full-length completions in one call) + the update's row tokens at
the bare forward+backward+AdamW loop's rate (benchmarks/bench_trainer.py's baseline, on
the same kind of rows) + the step's own weight sync. Both rates are measured once and
then raised to any step's that beat them (the machine's speed drifts), so no part of the
bound exceeds what that part of a step took.

Checks (each can fail; ``--plant`` breaks one on purpose to show it):

1. TRACE's generated tok/s >= 0.9x uniform's, per task and engine
   (``--plant serial-fallback``: the single-turn fallback waits for a second round);
2. the update's trained tok/s beside vLLM within 10 % of beside HF, on the same rows
   (``--plant shared-threads``: the trainer runs on whatever count the engine left);
3. ``make_engine("auto")`` picks the engine whose median step was faster here;
4. our step <= 0.3x TRL's ``GRPOTrainer`` step on TRL's job (the single task, uniform,
   the engine ``auto`` picks), the two alternated step by step (TRL's arm is skipped,
   with a line saying so, when ``trl`` does not import; ``benchmarks/trl_grpo_arm.py``).

Usage: ``python benchmarks/bench_step.py [--rounds 3] [--single-rounds 16] [--multi-prompts 32]
[--engines hf,vllm] [--tasks single,multi] [--no-trl] [--plant serial-fallback|shared-threads]
[--json FILE]`` (about 35 min on an AVX-512 box, 76 on an AVX2-only one). Timing needs an idle
machine: run nothing else beside it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import warnings

import numpy as np

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # vLLM's NUMA notice at start-up: read before torch loads

warnings.filterwarnings("ignore", category=FutureWarning, module="vllm")  # its own deprecations, at import

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from trace_gym.report import markdown_table, mean_ci  # noqa: E402
from trl_grpo_arm import trl_arm, trl_child  # noqa: E402  (TRL's side-by-side arm)

TASKS = {
    # TRL's job: one turn of at most 64 tokens (a tool call in it is cut, reward 0)
    "single": dict(env="math_python", max_turns=1, max_turn_tokens=64, max_episode_tokens=1024),
    # 1..8 in at most 3 guesses of up to 32 tokens: the 135M policy wins some (mixed groups to train on)
    # (the reply's last integer is its guess: the 135M policy ignores the ``guess: N`` format)
    "multi": dict(env="guess_number", env_kwargs=dict(high=8, max_turns=3, guess_format="number"), max_turns=3,
                  max_turn_tokens=32, max_episode_tokens=1024),
}
#: prompts per step; the nominal budget is 4 rollouts a prompt (uniform P x 4, TRACE 2P roots
#: + 4P continuations / 2). ``single`` is TRL's job (4 x 4); ``multi`` is wide enough that
#: TRACE's root phase (2P sequences a turn) is past the steep part of the engines' width
#: curve (``--multi-prompts 16`` or ``4`` run the narrower cases; the curve is printed first)
PROMPTS = {"single": 4, "multi": 32}
WIDTHS = (8, 16, 32, 64)


def strategy_over(strategy: str, prompts: int) -> dict:
    budget = dict(root_budget=2 * prompts, continuations_per_root=2)  # nominal 4P: every strategy's
    return {**budget, **(dict(strategy="uniform", group_size=4) if strategy == "uniform" else dict(strategy="trace"))}


STRATEGIES = ("uniform", "trace")


@dataclass
class Arm:
    task: str
    strategy: str
    engine: str
    cfg: Any
    setup: Any
    tasks: list
    predictor: Any
    rng: np.random.Generator
    rows: list[dict] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.task}/{self.strategy}/{self.engine}"


def make_cfg(task: str, strategy: str, engine: str, lr: float) -> Any:
    from trace_gym.config import load_config
    from trace_gym.train.config import TrainConfig

    prompts = PROMPTS[task]
    over = {**TASKS[task], **strategy_over(strategy, prompts), "engine": engine, "candidates": prompts,
            "temperature": 0.7,
            "eval_every": 0, "progress": False, "run_dir": "/nonexistent", "trainer.lr": lr, "seed": 0}
    return load_config(TrainConfig, None, over)


def make_arm(task: str, strategy: str, engine: str, lr: float, predictor: bool = True) -> Arm:
    from trace_gym.commands.train import resolve_train_setup
    from trace_gym.models import resolve_model
    from trace_gym.predictor.kinds import make_predictor

    cfg = make_cfg(task, strategy, engine, lr)
    setup = resolve_train_setup(cfg)
    tasks = list(setup.load_train_tasks())
    if task == "multi":
        from environments.guess_number.env import make_tasks

        tasks = make_tasks(64, high=8, seed=0)
    built = make_predictor(cfg.predictor, cfg.predictor_kwargs, model_path=str(resolve_model(cfg.policy)),
                           seed=0) if predictor else None
    return Arm(task, strategy, engine, cfg, setup, tasks, built, np.random.default_rng([0, 1]))


#: one counter of weight versions over every engine
VERSIONS = itertools.count(1)


def first_observations(arm: Arm, n: int) -> list[tuple[Any, list[dict]]]:
    """``(task, first observation as chat messages)`` of the arm's first ``n`` tasks."""
    env = arm.setup.make_env()
    try:
        return [(task, [m.to_dict() for m in env.reset(seed=0, options={"task": task})[0]]) for task in arm.tasks[:n]]
    finally:
        env.close()


def run_arm(arm: Arm, step: int, trainer: Any, engines: dict, backend: Any, record: bool) -> dict:
    from trace_gym.train.loop import policy_step

    n = PROMPTS[arm.task]
    candidates = [arm.tasks[(step * n + i) % len(arm.tasks)] for i in range(n)]
    engine = engines[arm.engine]
    t0 = time.perf_counter()
    batch, token_trees, update, sync = policy_step(arm.cfg, arm.setup, candidates, next(VERSIONS), arm.predictor,
                                                   trainer, engine, backend, arm.rng)
    seconds = time.perf_counter() - t0
    led = batch.ledger
    row = {"generated": led.generated_tokens, "generation_s": led.seconds.get("generation", 0.0),
           "environment_s": led.seconds.get("environment", 0.0), "rollouts": led.rollouts,
           "continuations": led.continuations, "row_tokens": update.get("row_tokens", 0.0),
           "trained": update.get("trained_tokens", 0.0), "update_s": update["seconds"], "sync_s": sync,
           "step_s": seconds, "token_trees": token_trees}
    if record:
        arm.rows.append(row)
    return row


def width_curve(engine: Any, prompts: list[list[int]]) -> dict[int, float]:
    """Generated tok/s of one call per batch width in :data:`WIDTHS` (after a warm-up),
    every completion its full 64 tokens; the best is the engine's peak in the bound."""
    from trace_gym.types import SamplingParams

    params = SamplingParams(max_tokens=64, temperature=1.0, seed=0)
    engine.generate(prompts[:2], 2, params)
    curve, engine.ignore_eos = {}, True  # every completion runs its 64 tokens: the batch stays full
    try:
        for width in WIDTHS:
            t0 = time.perf_counter()
            outs = engine.generate(prompts, width // len(prompts), params)
            tokens = sum(len(c.token_ids) for o in outs for c in o)
            curve[width] = tokens / (time.perf_counter() - t0)
    finally:
        engine.ignore_eos = False
    return curve


def bare_rate(trainer: Any) -> float:
    """Row tokens per second of the bare loop on bench_trainer's synthetic rows."""
    import torch
    from bench_trainer import bare_update, synthetic_trees

    from trace_gym.train.advantages import treerpo
    from trace_gym.train.batches import token_tree
    from trace_gym.utils.threads import torch_threads

    rows, _ = trainer._rows([token_tree(t, treerpo(t)) for t in synthetic_trees(2)])
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=0.0)  # AdamW's cost, the weights unmoved
    with torch_threads(trainer.threads):
        bare_update(trainer, rows, optimizer)
        seconds = statistics.median(bare_update(trainer, rows, optimizer) for _ in range(2))
    return sum(len(r) for r in rows) / seconds


def update_beside(trainer: Any, engines: dict, token_trees: list, prompts: list[list[int]], repeats: int) -> dict:
    """Trained tok/s of the same update right after each engine generated (alternated).

    Beside ``hf`` the update runs on the process's own count (what an HF-engine run has:
    nothing there changes it, :func:`~trace_gym.utils.threads.default_threads`); beside ``vllm``
    it runs as the trainer runs it, after vLLM's call set and gave back its own count."""
    from trace_gym.utils.threads import default_threads, torch_threads
    from trace_gym.types import SamplingParams

    rates: dict[str, list[float]] = {k: [] for k in engines}
    params = SamplingParams(max_tokens=32, temperature=1.0, seed=0)
    for _ in range(repeats):
        for kind, engine in engines.items():
            engine.generate(prompts, 2, params)  # the engine's state as a step leaves it
            with torch_threads(default_threads() if kind == "hf" else None):
                out = trainer.step(token_trees)
            rates[kind].append(out["trained_tokens"] / out["seconds"])
    return {k: statistics.median(v) for k, v in rates.items()}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows) if rows else float("nan")


def rate(rows: list[dict], num: str, den: str) -> float:
    """Sum over rounds of ``num`` / sum of ``den`` (one step's rate swings with its longest completion)."""
    total = sum(r[den] for r in rows)
    return sum(r[num] for r in rows) / total if total > 0 else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single-rounds", type=int, default=16,
                        help="rounds of the single-turn arms (at least --rounds; about 35 s each)")
    parser.add_argument("--engines", default="hf,vllm")
    parser.add_argument("--tasks", default="single,multi")
    parser.add_argument("--multi-prompts", type=int, default=PROMPTS["multi"],
                        help="prompts per multi-turn step (budget 4 rollouts each; 4 = the narrow case)")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--plant", choices=["serial-fallback", "shared-threads"], action="append", default=[],
                        help="break one check on purpose (repeatable)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        return trl_child(args.rounds, lambda: make_arm("single", "uniform", "hf", 1e-7, predictor=False),
                         first_observations, PROMPTS["single"])
    if args.multi_prompts < 1:
        parser.error(f"--multi-prompts must be at least 1, got {args.multi_prompts}")
    PROMPTS["multi"] = args.multi_prompts
    from trace_gym.train.backend import InProcessBackend
    from trace_gym.engines import make_engine, vllm_importable
    from trace_gym.models import pull_model, quiet_third_party
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig

    quiet_third_party()
    model = pull_model("smollm2-135m", progress=False)
    kinds = [k for k in args.engines.split(",") if k]
    if "vllm" in kinds and not vllm_importable()[0]:
        print(f"vllm arm skipped: {vllm_importable()[1]}")
        kinds.remove("vllm")
    engines = {k: make_engine(k, model, **({"max_model_len": 2048} if k == "vllm" else {})) for k in kinds}
    trainer_cfg = TrainerConfig(lr=1e-7, micro_batch_tokens=2048,
                                cpu_threads=int(os.environ.get("OMP_NUM_THREADS", 0) or 0))
    trainer = PolicyTrainer(model, trainer_cfg, total_steps=1000, device="cpu", temperature=0.7)
    if "shared-threads" in args.plant:  # the planted bug: one process-wide count, the serving engine's
        from trace_gym.utils.threads import set_threads

        trainer.threads = None
        set_threads(engines["vllm"].cpu_threads if "vllm" in engines else 1)
    backend = InProcessBackend()
    arms = [make_arm(t, s, e, 1e-7) for t in args.tasks.split(",") for e in kinds for s in STRATEGIES]
    if "serial-fallback" in args.plant:
        import trace_gym.agent.rollout as rollout

        rollout.AgentBranchRunner.single_turn = property(lambda self: False)
    rounds_of = {"single": max(args.rounds, args.single_rounds)}  # cheap, and its rate swings the most
    load = os.getloadavg()[0]
    print(f"cores: {os.cpu_count()}; load average before: {load:.1f}; trainer threads: {trainer.threads}; "
          f"engines: {', '.join(kinds)}; rounds: {args.rounds}, single-turn {rounds_of['single']} (+1 warm-up)")

    # the lower bound's rates
    tok = engines[kinds[0]].tokenizer
    chat = [tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
            for _, messages in first_observations(arms[0], 4)]
    curves = {k: width_curve(e, chat) for k, e in engines.items()}
    peaks = {k: max(c.values()) for k, c in curves.items()}
    bare = bare_rate(trainer)
    print("\n## The engines' width curve (one call, 64 tokens each) and the lower bound's rates\n")
    print(markdown_table(["engine", *(f"{w} wide tok/s" for w in WIDTHS), "8 / 16 wide"],
                         [[k, *(f"{c[w]:,.0f}" for w in WIDTHS), f"{c[8] / c[16]:.2f}x"] for k, c in curves.items()]))
    print(f"\nbound: each engine's best width above; bare forward+backward+AdamW (bench_trainer rows) "
          f"{bare:,.0f} row tok/s")

    step_counter = iter(range(10**6))

    def one_round(record: bool, offset: int) -> None:
        order = arms[offset % len(arms):] + arms[:offset % len(arms)]  # rotated: no arm always first
        step = next(step_counter)
        for arm in order:
            if not record or offset <= rounds_of.get(arm.task, args.rounds):
                run_arm(arm, step, trainer, engines, backend, record)

    one_round(False, 0)  # warm-up: caches, kernels, first-call costs
    trl_times: list[float] | str = "skipped (--no-trl)"
    rounds_done = [0]

    def between() -> None:
        rounds_done[0] += 1
        one_round(True, rounds_done[0])

    if not args.no_trl and any(a.task == "single" and a.strategy == "uniform" for a in arms):
        trl_times = trl_arm(__file__, args.rounds, between)
    while rounds_done[0] < max(rounds_of.get(a.task, args.rounds) for a in arms):
        between()

    # a rate measured once is a sample of a noisy machine: any step that ran faster raises it,
    # so each part of the bound stays at or below what that part of a step took
    for arm in arms:
        for r in arm.rows:
            if r["generation_s"] > 0:
                peaks[arm.engine] = max(peaks[arm.engine], r["generated"] / r["generation_s"])
            if r["update_s"] > 0 and r["row_tokens"]:
                bare = max(bare, r["row_tokens"] / r["update_s"])
    print("\n(rates after raising each to the fastest step that beat it: "
          + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in peaks.items()) + f", bare loop {bare:,.0f} row tok/s)")
    table, verdicts, out = [], [], {"peaks": peaks, "width_curves": curves, "bare_row_tok_s": bare, "arms": {}}
    for arm in arms:
        rows = arm.rows
        bound = [r["generated"] / peaks[arm.engine] + r["row_tokens"] / bare + r["sync_s"] for r in rows]
        ratio = statistics.median(r["step_s"] / b for r, b in zip(rows, bound))
        stats = {"gen_tok_s": rate(rows, "generated", "generation_s"), "update_tok_s": rate(rows, "trained", "update_s"),
                 "step_s": med(rows, "step_s"), "bound_s": statistics.median(bound), "ratio": ratio,
                 "generated": med(rows, "generated"), "trained": med(rows, "trained"), "gen_s": med(rows, "generation_s"),
                 "update_s": med(rows, "update_s"), "sync_s": med(rows, "sync_s"), "env_s": med(rows, "environment_s")}
        out["arms"][arm.name] = stats
        table.append([arm.task, arm.strategy, arm.engine, f"{stats['generated']:.0f}", f"{stats['gen_tok_s']:,.0f}",
                      f"{stats['trained']:.0f}", f"{stats['update_tok_s']:,.0f}", f"{stats['gen_s']:.1f}",
                      f"{stats['env_s']:.1f}", f"{stats['update_s']:.1f}", f"{stats['sync_s']:.2f}",
                      f"{stats['step_s']:.1f}", f"{stats['bound_s']:.1f}", f"{ratio:.2f}x"])
    print(f"\n## Steps (medians over rounds: {rounds_of['single']} single-turn, {args.rounds} others; "
          f"load average after: {os.getloadavg()[0]:.1f})\n")
    print(markdown_table(["task", "strategy", "engine", "gen tok", "gen tok/s", "trained tok", "update tok/s",
                          "gen s", "env s", "update s", "sync s", "step s", "lower bound s", "step / bound"], table))

    print("\n## Checks\n")
    by_name = {a.name: a for a in arms}
    for task in args.tasks.split(","):
        for kind in kinds:
            u, t = out["arms"].get(f"{task}/uniform/{kind}"), out["arms"].get(f"{task}/trace/{kind}")
            if u and t:
                r = t["gen_tok_s"] / u["gen_tok_s"]
                # the same prompts in each round: the per-round log ratios give the interval
                logs = [math.log((a["generated"] / a["generation_s"]) / (b["generated"] / b["generation_s"]))
                        for a, b in zip(by_name[f"{task}/trace/{kind}"].rows, by_name[f"{task}/uniform/{kind}"].rows)]
                mean, half, n = mean_ci(logs)
                if n > 1 and half == half:
                    low, high = math.exp(mean - half), math.exp(mean + half)
                    spread = (f"per-round geometric mean {math.exp(mean):.2f}x, 95 % CI [{low:.2f}, {high:.2f}] "
                              f"over {n} rounds" + (": cannot be told apart from 0.90x" if low < 0.9 < high else ""))
                else:
                    spread = "one round: no interval"
                narrow, wide = 2 * PROMPTS[task], 4 * PROMPTS[task]
                if task != "single" and narrow in curves[kind] and wide in curves[kind]:
                    # TRACE's roots run 2P sequences a turn before any continuation can be planned
                    spread += (f"; the engine alone at {narrow} wide (TRACE's root phase) runs at "
                               f"{curves[kind][narrow] / curves[kind][wide]:.2f}x its {wide}-wide rate")
                verdicts.append(("PASS" if r >= 0.9 else "FAIL",
                                 f"{task}/{kind} (budget {4 * PROMPTS[task]}): TRACE generates at {r:.2f}x "
                                 f"uniform's tok/s ({t['gen_tok_s']:,.0f} vs {u['gen_tok_s']:,.0f}; {spread}; "
                                 f"goal >= 0.90x)"))
    if len(engines) == 2:
        # the rows of TRL's job where it ran (a few hundred tokens: the repeats stay short)
        pool = [a for a in arms if a.task == "single"] or arms
        source = max((r for a in pool for r in a.rows), key=lambda r: r["trained"], default=None)
        if source is None or source["trained"] == 0:
            verdicts.append(("SKIP", "update beside each engine: no step of this run trained a token (no contrast)"))
        else:
            beside = update_beside(trainer, engines, source["token_trees"], chat, max(5, args.rounds))
            gap = beside["vllm"] / beside["hf"] - 1
            out["update_beside"] = beside
            verdicts.append(("PASS" if abs(gap) <= 0.10 else "FAIL",
                             f"update beside vllm {beside['vllm']:,.0f} vs beside hf {beside['hf']:,.0f} trained tok/s "
                             f"on the same rows ({source['trained']:.0f} trained tokens; {gap:+.0%}; goal within 10 %)"))
        per_engine = {k: statistics.median(out["arms"][a.name]["step_s"] for a in arms if a.engine == k) for k in kinds}
        faster = min(per_engine, key=per_engine.get)
        from trace_gym.engines import auto_engine_kind

        picked = auto_engine_kind("cpu")
        out["engine_steps"] = per_engine
        verdicts.append(("PASS" if picked == faster else "FAIL",
                         f"engine auto picks {picked} on this CPU; median step over the arms: "
                         + ", ".join(f"{k} {v:.1f} s" for k, v in per_engine.items()) + f" ({faster} faster)"))
    if isinstance(trl_times, str):
        verdicts.append(("SKIP", f"TRL's GRPOTrainer arm: {trl_times}"))
    else:
        from trace_gym.engines import auto_engine_kind

        ours_arm = next(a for a in arms if a.name == f"single/uniform/{auto_engine_kind('cpu')}")
        ours = out["arms"][ours_arm.name]["step_s"]
        whole = statistics.median(t for t, _ in trl_times)
        theirs = statistics.median(t - r for t, r in trl_times)  # its reward calls are ours: not counted for it
        out["trl_steps"] = trl_times
        print("\nTRL GRPOTrainer steps (s, of which its reward function): "
              + ", ".join(f"{t:.1f} ({r:.1f})" for t, r in trl_times))
        verdicts.append(("PASS" if ours <= 0.3 * theirs else "FAIL",
                         f"TRL's job: our whole step {ours:.1f} s ({ours_arm.name}) vs TRL GRPOTrainer {theirs:.1f} s "
                         f"without its reward calls ({whole:.1f} s with them) = {ours / theirs:.2f}x (goal <= 0.30x)"))
    for verdict, line in verdicts:
        print(f"{verdict}: {line}")
    out["verdicts"] = verdicts
    if args.json:
        for arm in arms:
            out["arms"][arm.name]["rounds"] = [{k: v for k, v in r.items() if k != "token_trees"} for r in arm.rows]
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    for e in engines.values():
        e.close()
    return 1 if any(v == "FAIL" for v, _ in verdicts) else 0


if __name__ == "__main__":
    raise SystemExit(main())
