"""Evaluating checkpoints on suites: the config, policy resolution, the result cache, the table.

:func:`run_eval` is what ``trace-gym eval`` (built in ``trace_gym/commands/eval.py``)
calls: every policy (a model name, an HF folder, or a run dir ``RUN[@STEP]``) on every
suite of :mod:`evaluators.suites`, through the core's agent loop.

Evaluation results are cached per (weights hash, suite, samples, seed, the content hash
of every data file read, and every other setting that changes the numbers) under
``$TRACE_GYM_CACHE/eval``, so a repeat is instant and an edited data file is re-evaluated.
Every cache file is written atomically per writer (a temp file of its own, then
``os.replace``: :func:`trace_gym.runs.files.atomic_write_text`), so concurrent evals never
interleave in one file, and read bounded: an entry that is torn, interleaved, too deep
or not a result is a cache miss (evaluated again), never an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from trace_gym.config import check_declared, doc
from trace_gym.env.datafiles import HELDOUT_FRACTION
from trace_gym.runs.files import atomic_write_text, iter_json_lines, read_json_file
from trace_gym.runs.policies import find_policy
from trace_gym.runs.weights import weights_hash
from trace_gym.utils.config_fields import SEEDS


@dataclass(frozen=True)
class EvalConfig:
    """``trace-gym eval``: checkpoints on evaluation suites."""

    policy: tuple[str, ...] = field(default=("smollm2-135m",), metadata=doc(
        "model names, HF folders or run dirs (RUN or RUN@STEP), comma-separated"))
    suites: tuple[str, ...] = field(default=("generated",), metadata=doc(
        "suite names or registered env ids with a task loader, comma-separated"))
    limit: int = field(default=64, metadata=doc(
        "tasks per suite (per category for bfcl); 0: all (64 for an env id)", within="[0, 10000000]"))
    samples: int = field(default=1, metadata=doc("samples per task (k of avg@k)", within="[1, 100000]"))
    pass_k: tuple[int, ...] = field(default=(1,), metadata=doc("k values of the unbiased pass@k", within="[1, 100000]"))
    temperature: float = field(default=0.0, metadata=doc(
        "0: greedy; > 0: sampled with the fixed seed", within="[0, 100]"))
    seed: int = field(default=0, metadata=doc("sampling and env seed", within=SEEDS))
    engine: str = field(default="hf", metadata=doc("rollout engine: auto | hf | vllm"))
    engine_kwargs: dict = field(default_factory=dict, metadata=doc("keyword arguments of the engine"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc(
        "extra env keyword arguments (e.g. the retrieval server of the QA suites)"))
    task_kwargs: dict = field(default_factory=dict, metadata=doc(
        "extra keyword arguments of an env id's task loader (suites that are env ids or families; e.g. "
        "{offline_scale: 0.03} for trace_gym/WikiQA-v0, with the same in env_kwargs)"))
    data_dir: str = field(default="", metadata=doc(
        "folder with local copies of the hub suites (<suite>.jsonl / .parquet / .json or <suite>/); "
        "a missing file is an error, not a hub download"))
    heldout_fraction: float = field(default=HELDOUT_FRACTION, metadata=doc(
        "held-out share of the generated family and of an env id's tasks (0 for an env id: no split)", within="[0, 1)"))
    max_turns: int = field(default=0, metadata=doc(
        "turns per episode (0: the suite's default, listed above)", within="[0, 10000]"))
    max_turn_tokens: int = field(default=0, metadata=doc(
        "generated tokens per turn (0: the suite's default, listed above)", within="[0, 1000000]"))
    max_episode_tokens: int = field(default=0, metadata=doc(
        "context limit per episode, tokens (0: the suite's default, listed above)", within="[0, 10000000]"))
    out: str = field(default="runs/eval", metadata=doc("folder for results.json and results.md", output="folder"))
    cache: bool = field(default=True, metadata=doc("reuse cached results of the same weights and settings"))
    cache_dir: str = field(default="", metadata=doc("cache folder (default $TRACE_GYM_CACHE/eval)"))
    progress: bool = field(default=True, metadata=doc("progress bars (episodes done, turns generated)"))
    dump_episodes: int = field(default=0, metadata=doc(
        "write this many transcripts per policy and suite into out (episodes-<policy>-<suite>.jsonl): "
        "messages, the extracted answer, the grader's verdict", within="[0, 1000000]"))

    def __post_init__(self) -> None:
        from evaluators.suites import SUITES, get_suite

        check_declared(self)  # every number's declared range (finite: temperature=nan is refused here)
        if not self.suites:
            raise ValueError("suites is empty; give a suite name or an env id")
        for name in self.suites:
            get_suite(name, self.task_kwargs)  # raises, naming the closest names
        if self.task_kwargs and all(name in SUITES for name in self.suites):
            raise ValueError(f"task_kwargs applies to suites that are env ids or families; {', '.join(self.suites)} "
                             "load their own tasks (data_dir gives their files)")
        if not self.policy:
            raise ValueError("policy is empty; give a model name, an HF folder or a run dir")
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"pass_k values {bad} must lie in [1, samples={self.samples}]")
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"greedy decoding (temperature 0) gives {self.samples} identical samples; "
                             "set samples=1 or temperature > 0")


def check_suite_env_kwargs(cfg: EvalConfig, suite: str) -> None:
    """The config's ``env_kwargs`` (over the suite's own) checked against the constructor of the
    suite's env (:func:`trace_gym.registry.check_family_kwargs`), before any policy loads."""
    from evaluators.suites import get_suite
    from trace_gym.registry import EnvFamily, check_family_kwargs

    if cfg.env_kwargs:
        spec = get_suite(suite, cfg.task_kwargs)
        check_family_kwargs(EnvFamily(spec.env_id, "", {}, {**dict(spec.env_kwargs), **cfg.env_kwargs}),
                            cfg.env_kwargs, {})


def _cache_dir(cfg: EvalConfig) -> Path:
    from trace_gym.models import cache_root

    return Path(cfg.cache_dir) if cfg.cache_dir else cache_root() / "eval"


def data_path(cfg: EvalConfig, suite: str) -> str | None:
    """The local file (or folder) of ``suite`` in ``cfg.data_dir``; ``None`` when no
    ``data_dir`` is set or the suite reads none (``Suite.data_file``).

    Raises:
        ValueError: ``data_dir`` is set and holds none of the suite's file names (one line
            naming the folder and the names; never a silent fall-back to the hub).
    """
    from evaluators.suites import get_suite

    spec = get_suite(suite)
    if not cfg.data_dir or not spec.data_file:
        return None
    base = Path(cfg.data_dir).expanduser()
    for name in spec.data_file_names():
        candidate = base / name.rstrip("/")
        if candidate.is_dir() if name.endswith("/") else candidate.is_file():
            return str(candidate)
    names = ", ".join(spec.data_file_names())
    if not base.is_dir():
        raise ValueError(f"data_dir {str(base)!r} does not exist (suite {suite!r} looks there for {names}; "
                         "unset data_dir to load it from the hub)")
    raise ValueError(f"data_dir {str(base)!r} has none of {names} for suite {suite!r} "
                     "(unset data_dir to load it from the hub)")


def _file_sha256(file: Path, memo: dict[str, list]) -> str:
    """SHA-256 of one file's bytes, memoised in ``memo`` by (resolved path, size, mtime)."""
    st = file.stat()
    key, stamp = str(file.resolve()), [st.st_size, st.st_mtime_ns]
    hit = memo.get(key)
    if isinstance(hit, list) and len(hit) == 3 and hit[:2] == stamp and isinstance(hit[2], str):
        return hit[2]
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    memo[key] = [*stamp, digest.hexdigest()]
    return memo[key][2]


def content_hashes(paths: Sequence[str | os.PathLike], memo_file: Path | None = None) -> dict[str, str]:
    """``{path: sha256}`` of each file's bytes, or of a folder's files (sha256 over every
    ``relative/name:sha256`` line, sorted by name), for the eval cache keys.

    Per-file hashes are memoised by size and mtime in ``memo_file`` (in the cache folder,
    never beside the files) (JSON; skipped where it cannot be written), so a large
    index is read once until it changes.
    """
    memo: dict[str, list] = {}
    if memo_file is not None and memo_file.exists():
        try:
            memo = read_json_file(memo_file)
        except (OSError, ValueError):  # unreadable, torn, too deep: start afresh
            memo = {}
        memo = memo if isinstance(memo, dict) else {}
    before = json.dumps(memo, sort_keys=True)
    out: dict[str, str] = {}
    for path in paths:
        p = Path(path)
        if p.is_dir():
            lines = [f"{f.relative_to(p).as_posix()}:{_file_sha256(f, memo)}"
                     for f in sorted(p.rglob("*")) if f.is_file()]
            out[str(path)] = hashlib.sha256("\n".join(lines).encode()).hexdigest()
        else:
            out[str(path)] = _file_sha256(p, memo)
    if memo_file is not None and json.dumps(memo, sort_keys=True) != before:
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(memo_file, json.dumps(memo))
        except OSError:
            pass  # a read-only cache: the hashes are recomputed next time
    return out


def local_paths(value: Any) -> list[str]:
    """Every existing local file or folder named in ``value`` (env kwargs: strings, and
    searcher specs ``kind:PATH`` such as ``bm25:/data/index``, at any depth of dicts and lists)."""
    if isinstance(value, str):
        for candidate in (value, value.partition(":")[2]):
            if candidate and "://" not in value and os.path.exists(candidate):
                return [candidate]
        return []
    if isinstance(value, dict):
        return [p for k in sorted(value, key=str) for p in local_paths(value[k])]
    if isinstance(value, (list, tuple)):
        return [p for v in value for p in local_paths(v)]
    return []


def tasks_hash(tasks: Sequence[Any]) -> str:
    """SHA-256 of the tasks' JSON form (id, prompt, answer, ...), for suites whose loader is
    code outside this package (``Suite.hash_tasks``)."""
    text = json.dumps([t.to_dict() for t in tasks], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(cfg: EvalConfig, digest: str, suite: str, tasks_digest: str | None = None) -> str:
    """The settings that determine a suite's numbers, hashed: every config key that changes
    them, the weights hash, the content hash of the suite's data file and of every local
    file named in ``env_kwargs`` (an index), and ``tasks_digest`` where given."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in ("policy", "suites", "out", "cache", "cache_dir", "progress", "engine_kwargs",
                             "dump_episodes")}
    settings["env_kwargs"] = json.dumps(cfg.env_kwargs, sort_keys=True, default=str)
    data = data_path(cfg, suite)
    files = content_hashes([*([data] if data else []), *local_paths(cfg.env_kwargs)],
                           _cache_dir(cfg) / "file_hashes.json")
    settings.update(weights=digest, suite=suite, data_path=data, data_sha256=files.get(data) if data else None,
                    env_files=files, tasks_sha256=tasks_digest)
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


def evaluate_cached(cfg: EvalConfig, folder: Path, suite: str, engine: Any = None, *,
                    digest: str | None = None) -> tuple[dict[str, Any], Any]:
    """One suite's result for the weights in ``folder``: from the cache when the same weights
    and settings were evaluated before, else run (on ``engine``, built when ``None``) and
    stored. Returns ``(result, engine or None)``; with ``cfg.dump_episodes`` the result's
    ``"transcripts"`` holds that many (kept beside the cached result, so a cached repeat
    has them too; a cache entry without enough of them is recomputed). ``digest``: the
    weights hash when the caller has it (:meth:`trace_gym.runs.policies.Policy.weights_hash`),
    else :func:`~trace_gym.runs.weights.weights_hash` of ``folder``. Writes nothing into ``folder``."""
    from evaluators import suites
    from trace_gym.engines import make_engine

    spec = suites.get_suite(suite, cfg.task_kwargs)
    path = data_path(cfg, suite)
    limit = cfg.limit or None
    tasks = suites.load_suite_tasks(spec, limit, path, cfg.heldout_fraction) if spec.hash_tasks else None
    key = cache_key(cfg, digest or weights_hash(folder), suite, tasks_hash(tasks) if tasks is not None else None)
    cached = _cache_dir(cfg) / f"{key}.json"
    episodes_file = cached.with_suffix(".episodes.jsonl")
    result = read_cached(cached) if cfg.cache else None
    if result is not None:
        result = result | {"cached": True}
        if not cfg.dump_episodes:
            return result, engine
        kept = read_transcripts(episodes_file)
        if len(kept) >= min(cfg.dump_episodes, result["tasks"] * result["samples"]):
            return result | {"transcripts": kept[:cfg.dump_episodes]}, engine
    if tasks is None:  # before the engine: a suite that cannot load says so before any model loads
        tasks = suites.load_suite_tasks(spec, limit, path, cfg.heldout_fraction)
    if engine is None:
        engine = make_engine(cfg.engine, folder, **cfg.engine_kwargs)
    result = run_suite(cfg, suite, engine, data=path, tasks=tasks)
    transcripts = result.pop("transcripts", None)
    cached.parent.mkdir(parents=True, exist_ok=True)
    if transcripts is not None:
        _write_jsonl(episodes_file, transcripts)
    atomic_write_text(cached, json.dumps(result))
    return result | {"cached": False} | ({"transcripts": transcripts} if transcripts is not None else {}), engine


def run_suite(cfg: EvalConfig, suite: str, engine: Any, *, data: str | None = None,
              tasks: Sequence[Any] | None = None) -> dict[str, Any]:
    """One suite run on ``engine`` with ``cfg``'s settings, no cache (:func:`evaluators.suites.evaluate`):
    ``data`` the suite's local file (:func:`data_path`), ``tasks`` already loaded ones (else loaded here)."""
    from evaluators import suites

    limits = {k: getattr(cfg, k) for k in ("max_turns", "max_turn_tokens", "max_episode_tokens") if getattr(cfg, k)}
    return suites.evaluate(engine, suite, limit=cfg.limit or None, samples=cfg.samples, temperature=cfg.temperature,
                           seed=cfg.seed, pass_k=cfg.pass_k, data_path=data, heldout_fraction=cfg.heldout_fraction,
                           progress=cfg.progress, agent_limits=limits, env_kwargs=cfg.env_kwargs, tasks=tasks,
                           transcripts=cfg.dump_episodes)


def training_eval_config(cfg: Any) -> EvalConfig:
    """The evaluation settings of a training run (``cfg``: a :class:`~trace_gym.train.config.TrainConfig`):
    its ``eval_suite`` on ``eval_tasks`` tasks, ``eval_samples`` samples each (greedy for one), with the
    run's policy, seed, engine, held-out split, agent limits and env kwargs. Checks the suite name."""
    return EvalConfig(policy=(cfg.policy,), suites=(cfg.eval_suite,), limit=cfg.eval_tasks, samples=cfg.eval_samples,
                      temperature=0.0 if cfg.eval_samples == 1 else cfg.temperature, seed=cfg.seed,
                      engine=cfg.engine, heldout_fraction=cfg.heldout_fraction, max_turns=cfg.max_turns,
                      max_turn_tokens=cfg.max_turn_tokens, max_episode_tokens=cfg.max_episode_tokens,
                      env_kwargs=cfg.env_kwargs, progress=cfg.progress)


@dataclass(frozen=True)
class TrainingEvaluator:
    """A training run's evaluation, ``(engine, step) -> result`` (``TrainSetup.evaluate``): step 0,
    the initial policy, through the cache ``trace-gym eval`` with these settings uses; later steps
    run afresh on the trained engine (their weights are new)."""

    cfg: EvalConfig

    def __call__(self, engine: Any, step: int) -> dict[str, Any]:
        suite = self.cfg.suites[0]
        if step == 0:
            from trace_gym.models import resolve_model

            return evaluate_cached(self.cfg, Path(resolve_model(self.cfg.policy[0])), suite, engine)[0]
        return run_suite(self.cfg, suite, engine)


def read_cached(path: Path) -> dict[str, Any] | None:
    """A cached suite result, or ``None`` (a miss): no file, or one that is torn, interleaved,
    too large or deep (read bounded: :func:`trace_gym.runs.files.read_json_file`), or not an
    object with integer ``tasks`` and ``samples``."""
    try:
        result = read_json_file(path)
    except (OSError, ValueError):
        return None
    if type(result) is not dict or type(result.get("tasks")) is not int or type(result.get("samples")) is not int:
        return None
    return result


def read_transcripts(path: Path) -> list[dict[str, Any]]:
    """The cached transcripts beside a result (bounded; a bad line is left out, so a damaged file
    holds too few and the suite is evaluated again)."""
    try:
        return [r for r in iter_json_lines(path) if type(r) is dict] if path.exists() else []
    except OSError:
        return []


def _write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """One JSON object per line (the bench's transcript file format), written atomically per writer."""
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in records))


def _file_label(text: str) -> str:
    """A policy or suite name as a file-name part (``runs/a@2`` -> ``runs_a@2``)."""
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in text).strip("._") or "policy"


def run_eval(cfg: EvalConfig, *, out: Any = None) -> list[dict[str, Any]]:
    """Evaluate every policy on every suite (cached); writes ``results.json`` and ``results.md``."""
    from trace_gym.models import quiet_third_party

    from trace_gym.runs.output_paths import check_config_outputs, write_output_text

    check_config_outputs(cfg)  # out: a folder that can be written, before any policy loads
    for suite in cfg.suites:  # input errors first, in one line, before any backend imports or download starts
        data_path(cfg, suite)
        check_suite_env_kwargs(cfg, suite)
    quiet_third_party()
    out = out or sys.stdout
    policies = [find_policy(spec) for spec in cfg.policy]  # every spec checked before any download
    resolved = [(policy, policy.folder()) for policy in policies]
    rows = []
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    for policy, folder in resolved:
        digest = policy.weights_hash()  # a checkpoint's from its verified manifest: no second read
        engine = None
        try:
            for suite in cfg.suites:
                result, engine = evaluate_cached(cfg, folder, suite, engine, digest=digest)
                transcripts = result.pop("transcripts", None)
                if transcripts is not None:
                    dump = Path(cfg.out) / f"episodes-{_file_label(policy.spec)}-{_file_label(suite)}.jsonl"
                    _write_jsonl(dump, transcripts)
                    result["episode_file"] = str(dump)
                result.update(policy=policy.spec, label=("ReAct (no RL): " if policy.base else "") + policy.label,
                              weights_sha256=digest)
                rows.append(result)
        finally:
            if engine is not None:
                engine.close()
    text = format_results(rows)
    print(text, file=out)  # first: a write that fails below is one line, the table already shown
    write_output_text(Path(cfg.out) / "results.json", json.dumps(rows, indent=2), key="out")  # `compare` reads it
    write_output_text(Path(cfg.out) / "results.md", text + "\n", key="out")
    return rows


def format_results(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown table (plus the BFCL per-category tables and each breakdown's, e.g.
    MMLU-Pro per category)."""
    from trace_gym.report import markdown_table

    ks = sorted({k for r in rows for k in r.get("pass_at_k", {})}, key=int)
    table = []
    for r in rows:
        lo, hi = r["accuracy_ci"]
        table.append([r["label"], r["suite"], r["tasks"], r["samples"],
                      f"{100 * r['accuracy']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]",
                      *[f"{100 * r['pass_at_k'][k]:.1f}" if k in r.get("pass_at_k", {}) else "-" for k in ks],
                      f"{r['mean_reward']:.3f}", f"{r['seconds']:.0f}", "yes" if r.get("cached") else "no"])
    parts = [markdown_table(["policy", "suite", "tasks", "samples", "accuracy % [95 % CI]",
                             *[f"pass@{k} %" for k in ks], "mean reward", "seconds", "cached"], table)]
    qa = [[r["label"], r["suite"], r["qa"]["n"], f"{100 * r['qa']['em']:.1f}", f"{100 * r['qa']['f1']:.1f}",
           f"{100 * r['qa']['answered']:.1f}"] for r in rows if "qa" in r]
    if qa:
        parts += ["", markdown_table(["policy", "suite", "questions", "EM %", "F1 %", "answered %"], qa)]
    for r in rows:
        if "bfcl" in r:
            parts += ["", f"BFCL v4 multi-turn, {r['label']}:", "", r["bfcl"]["markdown"]]
        if "breakdown" in r:
            by, groups = r["breakdown"]["by"], r["breakdown"]["groups"]
            cells = [[name, g["tasks"], f"{100 * g['accuracy']:.1f} [{100 * g['accuracy_ci'][0]:.1f}, "
                      f"{100 * g['accuracy_ci'][1]:.1f}]",
                      *[f"{100 * g['pass_at_k'][k]:.1f}" if k in g["pass_at_k"] else "-" for k in ks]]
                     for name, g in groups.items()]
            parts += ["", f"{r['suite']} by {by}, {r['label']}:", "",
                      markdown_table([by, "tasks", "accuracy % [95 % CI]", *[f"pass@{k} %" for k in ks]], cells)]
    return "\n".join(parts)
