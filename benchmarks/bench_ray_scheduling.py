"""The driver's bookkeeping at paper scale: 64 rollout workers, 256 env pools, M = 1024, N = 2.

A scheduling simulation. The driver is the real one -- ``trace_gym.agent.rollout.collect`` over a
:class:`~trace_gym.train.distributed.runner.RayAgentRunner`: the step driver's allocation and
expansion, the agent loop's rounds and chat-template rendering (SmolLM2's real tokenizer),
the engine group's seed-preserving sharding and sticky routing, the pool executor's
batching and placement. Only the actors are mocks, called through the in-process
transport (this machine cannot start 320 actor processes): a rollout worker sleeps
``--gen-s`` per generate call and returns ``--turn-tokens`` random tokens per completion,
an env pool (the real :class:`~trace_gym.train.distributed.env_pool.EnvPool`) holds mock envs
whose step sleeps ``--env-s``, ends an episode with probability ``--stop-p`` per turn or at
``--max-turns``, and snapshots/restores its state exactly. Arguments and results are
pickled on the way, as Ray would.

It prints, per step: the driver thread's CPU seconds (``time.thread_time``: bookkeeping,
never sleeping) and the part of it spent in chat-template deltas, the step's wall seconds,
and the bookkeeping against a *realistic* step of
the same size: the step's generated tokens at ``--fleet-tok-s`` tokens/s (default 160k:
8 GPUs x ~20k tok/s of an 8B model in vLLM), plus its rounds x ``--round-env-s`` of tool time.
Each step runs twice, side by side: with the renderer's baseline (``whole``: both
conversations tokenised whole at every turn, O(turns^2) per episode) and with its default
(``delta``: only the new text tokenised).

Usage: ``python benchmarks/bench_ray_scheduling.py [--workers 64] [--pools 256] [--roots 1024]
[--turn-tokens 256] [--max-turns 5] [--steps 2] [--renderers whole,delta]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from trace_gym.train.distributed.transport import LocalTransport  # noqa: E402
from trace_gym.env.contract import Snapshot, freeze, thaw  # noqa: E402
from trace_gym.types import Completion, Message, Task  # noqa: E402

RENDERERS = {"whole": "whole history (baseline)", "delta": "new text only (default)"}
WORDS = ("the value of x is then computed from the sum of the squares and we check each case carefully "
         "so the answer follows from the previous step with n equal to").split()


class PicklingTransport(LocalTransport):
    """The in-process transport, with arguments pickled in the caller and results pickled
    in the actor (what crossing a process boundary costs in CPU)."""

    def call(self, actor, method, *args):
        blob = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        return super().call(_Unpickler(actor), method, blob)

    def kill(self, actor):
        super().kill(actor)


class _Unpickler:
    _cache: dict[int, "_Unpickler"] = {}
    _lock = threading.Lock()

    def __new__(cls, actor):
        with cls._lock:
            inst = cls._cache.get(id(actor))
            if inst is None:
                inst = cls._cache[id(actor)] = super().__new__(cls)
                inst.actor = actor
            return inst

    def __getattr__(self, method):
        fn = getattr(self.actor, method)

        def run(blob):
            out = fn(*pickle.loads(blob))
            return pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))

        return run


class MockWorker:
    """A rollout worker that sleeps ``seconds`` per call and returns random tokens."""

    def __init__(self, seconds: float, tokens: int, seed: int):
        self.seconds, self.tokens = seconds, tokens
        self.rng = random.Random(seed)

    def generate(self, prefixes, n, sampling, expected_version):
        time.sleep(self.seconds)
        out = []
        for k in n:
            comps = []
            for _ in range(k):
                ids = [self.rng.randrange(100, 40000) for _ in range(self.tokens)]
                text = " ".join(self.rng.choice(WORDS) for _ in range(self.tokens * 3 // 4))
                comps.append(Completion(ids, [-1.0] * self.tokens, "length", 0, text))
            out.append(comps)
        return out

    def info(self):
        return {}


class MockEnv:
    """An env whose step sleeps; ends with probability ``stop_p`` per turn or at ``max_turns``."""

    snapshot_mode = "state"

    def __init__(self, seconds: float, stop_p: float, max_turns: int):
        self.seconds, self.stop_p, self.max_turns = seconds, stop_p, max_turns

    @property
    def unwrapped(self):
        return self

    def reset(self, *, seed=None, options=None):
        self.rng = np.random.default_rng(seed)
        self.turn = 0
        task = options["task"]
        return [Message("system", "Solve the problem; use Python when it helps."), Message("user", task.prompt)], {}

    def step(self, action):
        time.sleep(self.seconds)
        self.turn += 1
        done = self.turn >= self.max_turns or self.rng.random() < self.stop_p
        reward = float(done and self.rng.random() < 0.5)
        out = " ".join(WORDS[int(i) % len(WORDS)] for i in self.rng.integers(0, 1000, 60))
        return [Message("user", f"Output: {out}")], reward, done, False, {}

    def snapshot(self):
        return Snapshot("mock", "state", self.turn, freeze((self.turn, self.rng.bit_generator.state)))

    def restore(self, snapshot):
        self.turn, state = thaw(snapshot.state)
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state

    def close(self):
        pass


class MockEnvFactory:
    def __init__(self, seconds, stop_p, max_turns):
        self.args = (seconds, stop_p, max_turns)

    def __call__(self):
        return MockEnv(*self.args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--pools", type=int, default=256)
    parser.add_argument("--roots", type=int, default=1024, help="M (budget M (1 + N/2) with N = 2)")
    parser.add_argument("--candidates", type=int, default=1024)
    parser.add_argument("--turn-tokens", type=int, default=256, help="tokens per completion")
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--stop-p", type=float, default=0.3, help="chance an episode ends at each turn")
    parser.add_argument("--gen-s", type=float, default=0.5, help="mock seconds per generate call")
    parser.add_argument("--env-s", type=float, default=0.05, help="mock seconds per env step")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fleet-tok-s", type=float, default=160_000.0, help="realistic fleet generation rate")
    parser.add_argument("--round-env-s", type=float, default=2.0, help="realistic tool seconds per round")
    parser.add_argument("--renderers", default="whole,delta", type=lambda v: v.split(","),
                        help="chat-template deltas to run, in order: whole (baseline: both conversations tokenised "
                             "whole at every turn) and/or delta (only the new text tokenised, the default)")
    args = parser.parse_args()
    bad = [r for r in args.renderers if r not in RENDERERS]
    if bad:
        parser.error(f"--renderers: unknown {bad}; known: {', '.join(RENDERERS)}")

    from transformers import AutoTokenizer

    from trace_gym.agent.loop import AgentConfig
    from trace_gym.train.distributed.engines import EngineGroup
    from trace_gym.train.distributed.env_pool import EnvPool, EnvPoolGroup
    from trace_gym.train.distributed.runner import RayAgentRunner
    from trace_gym.models import pull_model
    from trace_gym.predictor.kinds import ConstantPredictor
    from trace_gym.report import markdown_table
    from trace_gym.agent.rollout import collect
    from trace_gym.strategies import shaped_strategies
    from trace_gym.types import SamplingParams

    from trace_gym.agent.chat import ChatRenderer

    rendering = [0.0]  # driver CPU seconds inside the agent loop's chat-template rendering

    def timed(method):
        def wrapper(self, *a, **k):
            c0 = time.thread_time()
            try:
                return method(self, *a, **k)
            finally:
                rendering[0] += time.thread_time() - c0
        return wrapper

    ChatRenderer.prompt, ChatRenderer.observation = timed(ChatRenderer.prompt), timed(ChatRenderer.observation)
    plain_init = ChatRenderer.__init__

    def init(self, *a, **k):  # --renderer whole: the baseline, both conversations tokenised whole every turn
        plain_init(self, *a, **k)
        if mode[0] == "whole":
            self._eot_splits = False

    ChatRenderer.__init__ = init
    mode = ["delta"]
    tokenizer = AutoTokenizer.from_pretrained(pull_model("smollm2-135m", progress=False))
    transport = PicklingTransport(threads=args.workers + args.pools + 16)
    workers = [MockWorker(args.gen_s, args.turn_tokens, i) for i in range(args.workers)]
    factory = MockEnvFactory(args.env_s, args.stop_p, args.max_turns)
    pools = EnvPoolGroup([EnvPool(factory, threads=8, name=f"p{i}") for i in range(args.pools)], transport, factory,
                         size=16)
    engine = EngineGroup(workers, transport, tokenizer)
    rng = np.random.default_rng(0)
    tasks = [Task(f"sim/{i}", " ".join(rng.choice(WORDS, 60))) for i in range(args.candidates)]
    strategy = shaped_strategies(["trace"], group_size=8, continuations_per_root=2)["trace"]
    budget = args.roots * 2.0  # M (1 + N/2) with N = 2
    agent = AgentConfig(max_turn_tokens=args.turn_tokens, max_episode_tokens=32768, max_turns=args.max_turns,
                        env_workers=1, straggler_seconds=60)
    rows = []
    for renderer in args.renderers:
        mode[0] = renderer
        for step in range(1, args.steps + 1):
            runner = RayAgentRunner(engine, tokenizer, pools, SamplingParams(temperature=1.0, seed=step), agent)
            calls0 = engine.calls
            rendering[0] = 0.0
            t0, c0 = time.perf_counter(), time.thread_time()
            batch = collect(tasks, strategy, ConstantPredictor(0.5), runner, budget, np.random.default_rng(step),
                            seed=step)
            cpu, wall = time.thread_time() - c0, time.perf_counter() - t0
            env_calls = dict(runner._pool.calls)
            runner.close()
            led = batch.ledger
            rounds = engine.calls - calls0
            realistic = led.generated_tokens / args.fleet_tok_s + rounds * args.round_env_s
            rows.append([RENDERERS[renderer], step, led.rollouts, led.continuations, led.env_steps,
                         led.generated_tokens, rounds, env_calls["step"], f"{cpu:.1f}", f"{rendering[0]:.1f}",
                         f"{wall:.1f}", f"{rounds * (args.gen_s + args.env_s):.1f}", f"{realistic:.0f}",
                         f"{100 * cpu / realistic:.1f} %", f"{100 * (cpu - rendering[0]) / realistic:.1f} %"])
    print(f"## Scheduling simulation: {args.workers} rollout workers, {args.pools} env pools, M = {args.roots}, N = 2, "
          f"{args.candidates} candidates, {args.turn_tokens} tokens/turn, <= {args.max_turns} turns "
          f"(mock generate {args.gen_s} s/call, env step {args.env_s} s)\n")
    print(markdown_table(["renderer", "step", "roots", "continuations", "env steps", "gen tokens", "rounds", "pool step calls",
                          "driver CPU s", "of which rendering s", "wall s", "mock sleep s", "realistic step s", "driver / realistic", "driver w/o rendering / realistic"], rows))
    print(f"\nrealistic step = generated tokens / {args.fleet_tok_s:,.0f} tok/s + rounds x {args.round_env_s} s of tools; "
          f"sticky routing hits: {engine.router.sticky}")
    transport.shutdown()


if __name__ == "__main__":
    main()
