"""Recording a bank: dense rollout trees of a real policy, through the agent loop of training.

For each prompt, :func:`record_bank` runs R root rollouts (one
:meth:`~trace_gym.agent.loop.AgentRunner.start_many`: a request with ``n = R``), and as soon
as they are back, K continuations from every visited prefix of every root (after each
non-final turn; :meth:`~trace_gym.agent.loop.AgentRunner.branch`: restore the env snapshot
into fresh envs, reuse the token prefix, one request with ``n = K``). The engine, the
env factory, the agent limits and the token bookkeeping are those of training and
``bench --env``, so a replayed outcome is one the live loop would have produced.

Per-root prefix cap (``max_prefixes_per_root``): a root with more visited prefixes than
the cap gets continuations at ``cap`` of them, evenly spaced over its turns (the first
and the last prefix included); the others are listed in the root's ``left_out``, and
the replay does not offer them to the allocators (the bench reports how many were
left out). With R roots, T turns and K continuations, a prompt costs about
R (1 + min(T - 1, cap) K (1 - t/T)) rollouts; the cap is what keeps long episodes
(BFCL, 10+ turns) within a recording budget.

Scheduling: ``batch_prompts`` prompts are in flight at once (memory: that many prompts'
episodes and snapshots and the engine's cached KV of them, never the bank: a written
prompt's KV is dropped from the engine's prefix cache, :func:`_forget_prompt`), all their
roots and branches in the same
generation rounds (one batched ``engine.generate`` per round, :class:`~trace_gym.agent.loop.AgentRunner`);
the moment a prompt is written the next one's roots start (``schedule="rolling"``), so
the rounds stay wide to the end. The recorder reports prompts per minute and an ETA
after each prompt.

Durability: each prompt is written the moment its last
branch returns, as one fsync'd line (:class:`~trace_gym.banks.writer.BankWriter`). A
killed recording keeps every prompt it wrote; rerunning the same call cuts a partial
last line (or, when the recording was killed while writing its header, starts afresh),
skips the prompts already there and records each remaining prompt exactly once; the
footer (count + checksum) is written when every prompt is in.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from trace_gym.banks.format import success
from trace_gym.banks.writer import (BankWriter, lock_path, portable_command, portable_path, shared_policy_path,
                                    weights_hash)
from trace_gym.runs.files import release_lock
from trace_gym.tree import prefix_depths
from trace_gym.budget import BudgetLedger


def episode_end(ep: Any) -> str:
    """How an episode ended: ``terminated`` (the env said done), ``truncated`` (the env's own
    limit), the agent's reason (``max_turns``, ``episode_tokens``, ``env_error``), or ``error``
    (no turn of its own: a failed reset/restore, a prompt over the limit)."""
    turns = ep.own_turns
    if not turns:
        return "error"
    last = turns[-1]
    if last.terminated:
        return "terminated"
    if last.truncation in ("max_turns", "episode_tokens", "env_error"):
        return last.truncation
    return "truncated" if last.truncated else "cut"


def episode_record(ep: Any) -> dict[str, Any]:
    """One recorded episode (its own turns only; a continuation's inherited prefix is its anchor's).

    Per turn: the texts a predictor reads (``action``, ``observation``), the live node's
    extras (``finish_reason``, ``truncation``, ``env_error``, ``cached_tokens``) and its exact
    costs: ``policy_tokens`` generated, ``observation_tokens``, ``context_tokens`` before the
    turn's generation, ``prefill_tokens`` = context - cached (what the engine computed),
    ``env_steps``.
    """
    inherited = len(ep.turns) - len(ep.own_turns)
    context = len(ep.prompt_ids) + sum(len(t.action_ids) + len(t.obs_ids) for t in ep.turns[:inherited])
    turns = []
    for n, turn in enumerate(ep.own_turns):
        turns.append({"depth": inherited + n + 1, "action": turn.action_text,
                      "observation": [m.to_dict() for m in turn.obs_messages], "finish_reason": turn.finish_reason,
                      "truncation": turn.truncation, "env_error": turn.info.get("env_error"),
                      "cached_tokens": turn.cached_tokens, "policy_tokens": len(turn.action_ids),
                      "observation_tokens": len(turn.obs_ids), "context_tokens": context,
                      "prefill_tokens": max(context - (turn.cached_tokens or 0), 0), "env_steps": 1})
        context += len(turn.action_ids) + len(turn.obs_ids)
    reward = ep.reward if turns else None
    return {"error": ep.error, "reward": reward, "success": success(reward), "end": episode_end(ep), "turns": turns}


@dataclass
class _Prompt:
    index: int
    task: Any
    roots: list = field(default_factory=list)  # Episode per root, in seed order
    back: int = 0  # roots returned
    live: int = 0  # branches out
    prefixes: dict = field(default_factory=dict)  # root j -> [(depth, [Episode], replayed steps each)]


def _record_stream(agent: Any, todo: Sequence[tuple[int, Any]], cfg: dict[str, Any], ledger: BudgetLedger,
                   window: int, schedule: str = "rolling"):
    """Yield each prompt's record as soon as its last branch is back, with at most
    ``window`` prompts in flight. ``rolling``: the next prompt's roots start the moment a
    prompt is written, so every generation round stays as wide as the window allows;
    ``batches`` (the recorder before): the next ``window`` prompts start once the whole
    batch is written, and a batch's last prompts generate alone."""
    from trace_gym.types import env_seed

    roots, k, cap, seed = cfg["roots"], cfg["continuations"], cfg["max_prefixes_per_root"], cfg["seed"]
    state: dict[int, _Prompt] = {}
    pending = iter(todo)

    def refill() -> None:
        for p, task in itertools.islice(pending, window - len(state)):
            st = state[p] = _Prompt(p, task)
            st.roots = agent.start_many([(task, env_seed(seed, p, j)) for j in range(roots)], anchor=(p, -1, 0),
                                        ledger=ledger)
            st.live = roots

    refill()
    while state:
        for ep in agent.advance():
            p, j, _ = ep.anchor
            st = state[p]
            st.live -= 1
            if j < 0:
                st.back += 1
                if st.back == roots:
                    _expand(agent, st, k, cap, ledger)
            if st.live == 0:
                yield _prompt_record(state.pop(p))
                _forget_prompt(agent.engine, st)
                if schedule == "rolling":
                    refill()
        if not state:
            refill()


def _forget_prompt(engine: Any, st: _Prompt) -> None:
    """Let the engine drop what it cached of a written prompt (``forget_prefix``, where it has
    one: the HF engine's prefix KV cache), which no later prompt extends: without it the cache
    kept every finished prompt's KV until its byte budget (1 GiB) was full."""
    forget = getattr(engine, "forget_prefix", None)
    if callable(forget):
        for ids in {tuple(ep.prompt_ids) for ep in st.roots if ep.prompt_ids}:
            forget(ids)


def rate_text(recorded: int, remaining: int, seconds: float) -> str:
    """Prompts per minute of this run and the time left at that rate.

    >>> rate_text(4, 12, 120.0)
    '2.0 prompts/min, ETA 6.0 min'
    """
    if recorded <= 0 or seconds <= 0:
        return "rate: measuring"
    per_min = recorded / seconds * 60
    eta = remaining / per_min
    return f"{per_min:.1f} prompts/min, ETA " + (f"{eta:.1f} min" if eta < 120 else f"{eta / 60:.1f} h")


def _expand(agent: Any, st: _Prompt, k: int, cap: int | None, ledger: BudgetLedger) -> None:
    for j, root in enumerate(st.roots):
        st.prefixes[j] = []
        for depth in prefix_depths(len(root.turns), cap):
            if k == 0:
                st.prefixes[j].append((depth, [], []))
                continue
            before = ledger.replayed_env_steps  # the restores run inside branch(), at once
            kids = agent.branch(root, depth, k, anchor=(st.index, j, depth), ledger=ledger)
            restored = [kid.error is None for kid in kids]
            each = (ledger.replayed_env_steps - before) // max(sum(restored), 1)
            st.prefixes[j].append((depth, kids, [each if ok else 0 for ok in restored]))
            st.live += k


def _prompt_record(st: _Prompt) -> dict[str, Any]:
    roots = []
    for j, ep in enumerate(st.roots):
        rec = episode_record(ep) | {"seed": ep.seed}
        prefixes = st.prefixes.get(j, [])
        rec["prefixes"] = [{"depth": depth, "continuations": [episode_record(kid) | {"replayed_env_steps": steps}
                                                               for kid, steps in zip(kids, replayed)]}
                           for depth, kids, replayed in prefixes]
        recorded = {depth for depth, *_ in prefixes}
        rec["left_out"] = [d for d in range(1, max(len(ep.turns), 1)) if d not in recorded]
        roots.append(rec)
    prompt_tokens = next((len(ep.prompt_ids) for ep in st.roots if ep.prompt_ids), 0)
    return {"task": st.task.to_dict(), "task_index": st.index, "prompt_tokens": prompt_tokens, "roots": roots}


def _check_record_args(schedule: str, prompts: int, roots: int, continuations: int, batch_prompts: int,
                       max_prefixes_per_root: int | None) -> None:
    """``ValueError`` naming the first bad argument of :func:`record_bank`."""
    if schedule not in ("rolling", "batches"):
        raise ValueError(f"schedule must be 'rolling' or 'batches', got {schedule!r}")
    if prompts < 1 or roots < 1 or continuations < 0 or batch_prompts < 1:
        raise ValueError(f"need prompts >= 1, roots >= 1, continuations >= 0, batch_prompts >= 1; got "
                         f"{prompts}, {roots}, {continuations}, {batch_prompts}")
    if max_prefixes_per_root is not None and max_prefixes_per_root < 1:
        raise ValueError(f"max_prefixes_per_root must be >= 1 or None, got {max_prefixes_per_root!r}")


def _open_writer(out: str, manifest: dict[str, Any], say: Callable[[str], None], lock: Any = None) -> BankWriter:
    """The bank's writer (resuming an existing file), saying what a killed recording left."""
    writer = BankWriter(out, manifest, resume=True, lock=lock)
    if writer.torn_header:
        say(f"{out}: held only {writer.truncated_bytes} bytes of a header (a recording killed as it started); "
            "started afresh")
    elif writer.truncated_bytes:
        say(f"{out}: cut {writer.truncated_bytes} bytes of a partial last line (a killed recording)")
    return writer


def _bank_tasks(family: Any, prompts: int, seed: int, present: set, out: str) -> list:
    """The ``prompts`` tasks of ``family`` (unique ids, a superset of what ``out`` already holds)."""
    tasks = list(family.load_tasks(prompts, seed=seed))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"the task loader returned duplicate task ids (e.g. {twice!r}); a bank keys prompts by id")
    stray = sorted(set(present) - set(ids))
    if stray:
        raise ValueError(f"{out} holds prompts the task loader no longer returns ({stray[:3]}...); "
                         "record into another file")
    return tasks


def _write_records(writer: BankWriter, records: Iterable[dict], run: int, total: int, todo: int, progress: bool,
                   say: Callable[[str], None]) -> int:
    """Write each prompt's record the moment it is finished, with a bar (prompts/min, ETA) and a
    line per prompt; returns how many were written."""
    from tqdm.auto import tqdm

    written, t0 = 0, time.perf_counter()
    with tqdm(total=total, initial=total - todo, desc="bank record", unit="prompt", disable=not progress,
              dynamic_ncols=True) as bar:
        for record in records:
            writer.add(record | {"run": run, "written_at": time.time()})
            written += 1
            rate = rate_text(written, todo - written, time.perf_counter() - t0)
            bar.set_postfix_str(rate.split(",")[0], refresh=False)
            bar.update(1)
            say(f"prompt {len(writer.present)}/{total} written: {record['task']['id']}; {rate}")
    return written


def _env_fields(family: Any) -> dict[str, Any]:
    """The manifest's record of the env family: its id, env and task-loader keyword arguments."""
    return {"env_id": getattr(family, "env_id", type(family).__name__),
            "env_kwargs": dict(getattr(family, "env_kwargs", {})),
            "task_loader_kwargs": dict(getattr(family, "loader_kwargs", {}))}


def _ledger_fields(ledger: BudgetLedger) -> dict[str, int]:
    """The footer's record of one run's exact costs."""
    return {"generated_tokens": ledger.generated_tokens, "prefill_tokens": ledger.prefill_tokens,
            "env_steps": ledger.env_steps, "errors": ledger.errors}


def record_bank(out: str, *, engine: Any, family: Any, prompts: int, roots: int, continuations: int,
                max_prefixes_per_root: int | None = None, sampling: Any = None, agent_config: Any = None,
                seed: int = 0, batch_prompts: int = 8, schedule: str = "rolling", policy: str = "",
                policy_path: str | None = None, command: Sequence[str] | None = None, progress: bool = False,
                say: Callable[[str], None] | None = None, lock: Any = None) -> dict[str, Any]:
    """Record (or finish recording) a bank into ``out``; returns a summary.

    Args:
        out: the bank file (``.jsonl.gz``); if it exists, the recording resumes (same
            settings required, else ``BankError`` naming what differs).
        engine: the rollout engine (``generate``, ``tokenizer``), as in training.
        family: the env: ``make_env() -> AgentEnv`` and ``load_tasks(n, seed) -> list[Task]``
            (``env_id`` / ``env_kwargs`` attributes, when it has them, go into the manifest).
        prompts: P, tasks loaded with ``load_tasks(P, seed)`` (ids must be unique).
        roots: R root rollouts per prompt.
        continuations: K continuations per recorded prefix.
        max_prefixes_per_root: the per-root prefix cap (``None``: every prefix); see the module docstring.
        sampling: :class:`~trace_gym.types.SamplingParams` (``max_tokens`` comes from ``agent_config``).
        agent_config: :class:`~trace_gym.agent.loop.AgentConfig` (turn/episode limits).
        seed: task seed, and base of the env seeds (root j of task p resets with
            ``seed + 1000 p + j``, :func:`trace_gym.types.env_seed`, as the live runner does).
        batch_prompts: prompts in flight at once (memory: one batch).
        schedule: ``"rolling"`` (a new prompt starts the moment one is written: the engine's
            batch stays full) or ``"batches"`` (the recorder before: each batch of
            ``batch_prompts`` waits for its last prompt; ``benchmarks/bench_bank_record.py``).
        policy: the policy's name, for the manifest; ``policy_path``: its folder (weights hashed).
            The manifest records the name, the weights' SHA-256 and the folder only when it lies
            inside the working folder, relative to it (:func:`~trace_gym.banks.writer.shared_policy_path`).
        command: the command line for the manifest (default ``sys.argv``), its absolute paths
            made portable (:func:`~trace_gym.banks.writer.portable_command`).
        progress: a progress bar over prompts, with prompts per minute and ETA.
        say: receives one line after each prompt is durably written (``prompt n/P written: id;
            r prompts/min, ETA m min``), and the resume notes.
        lock: the bank's lock, already taken (:func:`~trace_gym.banks.writer.lock_bank`; the
            command takes it before the model loads); ``None``: taken here. Released at the end.

    Returns:
        ``{"path", "prompts", "recorded", "skipped", "truncated_bytes", "seconds", "complete"}``
        and, after a recording, ``prompts_per_minute`` (this run's prompts over its recording time).
    """
    from trace_gym.agent.loop import AgentConfig, AgentRunner
    from trace_gym.types import SamplingParams

    say = say or (lambda msg: None)
    sampling = sampling or SamplingParams()
    agent_config = agent_config or AgentConfig()
    t0 = time.perf_counter()
    try:
        _check_record_args(schedule, prompts, roots, continuations, batch_prompts, max_prefixes_per_root)
        manifest = {
            "policy": portable_path(policy) if policy else policy, "policy_path": shared_policy_path(policy_path),
            "weights_sha256": weights_hash(policy_path), "engine": type(engine).__name__, **_env_fields(family),
            "sampling": dataclasses.asdict(sampling), "agent": dataclasses.asdict(agent_config), "seed": seed,
            "prompts": prompts, "roots": roots, "continuations": continuations,
            "max_prefixes_per_root": max_prefixes_per_root,
            "command": portable_command(sys.argv if command is None else command), "created_at": time.time(),
        }
    except BaseException:
        release_lock(lock, lock_path(out), remove=True)
        raise
    writer = _open_writer(out, manifest, say, lock)  # owns the lock from here (released if it fails to open)
    try:
        cfg = {"roots": roots, "continuations": continuations, "max_prefixes_per_root": max_prefixes_per_root,
               "seed": seed, "batch_prompts": batch_prompts, "schedule": schedule, "command": manifest["command"]}
        summary = _record_into(writer, out, engine, family, prompts, sampling, agent_config, cfg, progress, say)
    finally:
        writer.close()
    summary["seconds"] = time.perf_counter() - t0
    return summary


def _record_into(writer: BankWriter, out: str, engine: Any, family: Any, prompts: int, sampling: Any,
                 agent_config: Any, cfg: dict[str, Any], progress: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """:func:`record_bank` once its writer holds the bank: the prompts still to record, recorded
    (``cfg``: the counts, seed, window, schedule and command line of the call)."""
    from trace_gym.agent.loop import AgentRunner

    summary = {"path": str(out), "prompts": len(writer.present), "recorded": 0, "skipped": len(writer.present),
               "truncated_bytes": writer.truncated_bytes, "seconds": 0.0, "complete": writer.complete}
    if writer.complete:
        say(f"{out} is complete ({len(writer.present)} prompts); nothing to record")
        return summary
    tasks = _bank_tasks(family, prompts, cfg["seed"], writer.present, out)
    todo = [(p, t) for p, t in enumerate(tasks) if t.id not in writer.present]
    if writer.present:
        say(f"{out}: resuming, {len(writer.present)} prompts already recorded, {len(todo)} to go")
    run = writer.start_run(cfg["command"])
    ledger = BudgetLedger()
    agent = AgentRunner(engine, engine.tokenizer, family.make_env, sampling, agent_config)
    t_run = time.perf_counter()
    try:
        records = _record_stream(agent, todo, cfg, ledger, cfg["batch_prompts"], cfg["schedule"])
        summary["recorded"] = _write_records(writer, records, run, len(tasks), len(todo), progress, say)
    finally:
        agent.close()
    footer = writer.finish(tasks=len(tasks), last_run=_ledger_fields(ledger))
    summary.update(prompts=footer["prompts"], complete=True,
                   prompts_per_minute=summary["recorded"] / max(time.perf_counter() - t_run, 1e-9) * 60)
    say(f"{out}: complete, {footer['prompts']} prompts ({footer['seconds']:.0f} s over {footer['runs']} run(s))")
    return summary
