"""Evaluating checkpoints on suites: the config, policy resolution, the result cache, the table.

:func:`run_eval` is what ``trace-gym eval`` (built in ``trace_gym/commands/eval.py``)
calls: every policy (a model name, an HF folder, or a run dir ``RUN[@STEP]``) on every
suite of :mod:`evaluators.suites`, through the core's agent loop.

Evaluation results are cached per (weights hash, suite, samples, seed, and every other
setting that changes the numbers) under ``$TRACE_GYM_CACHE/eval``, so a repeat is instant.
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

from trace_gym.config import doc
from trace_gym.models import weights_hash  # noqa: F401  (re-exported: the one definition is the core's)


@dataclass(frozen=True)
class EvalConfig:
    """``trace-gym eval``: checkpoints on evaluation suites."""

    policy: tuple[str, ...] = field(default=("smollm2-135m",), metadata=doc(
        "model names, HF folders or run dirs (RUN or RUN@STEP), comma-separated"))
    suites: tuple[str, ...] = field(default=("generated",), metadata=doc("suite names, comma-separated"))
    limit: int = field(default=64, metadata=doc("tasks per suite (per category for bfcl); 0: all"))
    samples: int = field(default=1, metadata=doc("samples per task (k of avg@k)"))
    pass_k: tuple[int, ...] = field(default=(1,), metadata=doc("k values of the unbiased pass@k"))
    temperature: float = field(default=0.0, metadata=doc("0: greedy; > 0: sampled with the fixed seed"))
    seed: int = field(default=0, metadata=doc("sampling and env seed"))
    engine: str = field(default="hf", metadata=doc("rollout engine: auto | hf | vllm"))
    engine_kwargs: dict = field(default_factory=dict, metadata=doc("keyword arguments of the engine"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc(
        "extra env keyword arguments (e.g. the retrieval server of the QA suites)"))
    data_dir: str = field(default="", metadata=doc(
        "folder with local copies of the math suites (<suite>.jsonl / .parquet / .json or <suite>/)"))
    heldout_fraction: float = field(default=0.2, metadata=doc("held-out share of the generated family"))
    max_turns: int = field(default=0, metadata=doc("turns per episode (0: the suite's default)"))
    max_turn_tokens: int = field(default=0, metadata=doc("tokens per turn (0: the suite's default)"))
    max_episode_tokens: int = field(default=0, metadata=doc("context limit (0: the suite's default)"))
    out: str = field(default="runs/eval", metadata=doc("folder for results.json and results.md"))
    cache: bool = field(default=True, metadata=doc("reuse cached results of the same weights and settings"))
    cache_dir: str = field(default="", metadata=doc("cache folder (default $TRACE_GYM_CACHE/eval)"))
    progress: bool = field(default=True, metadata=doc("progress bars"))

    def __post_init__(self) -> None:
        from evaluators.suites import SUITES

        unknown = [s for s in self.suites if s not in SUITES]
        if unknown or not self.suites:
            raise ValueError(f"unknown suite(s) {unknown or list(self.suites)}; known: {sorted(SUITES)}")
        if not self.policy:
            raise ValueError("policy is empty; give a model name, an HF folder or a run dir")
        if self.samples < 1 or self.limit < 0 or self.temperature < 0:
            raise ValueError(f"need samples >= 1, limit >= 0, temperature >= 0; got {self.samples}, {self.limit}, "
                             f"{self.temperature}")
        bad = [k for k in self.pass_k if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"pass_k values {bad} must lie in [1, samples={self.samples}]")
        if self.temperature == 0 and self.samples > 1:
            raise ValueError(f"greedy decoding (temperature 0) gives {self.samples} identical samples; "
                             "set samples=1 or temperature > 0")


# ---------------------------------------------------------------------- policies
def resolve_policy(spec: str) -> tuple[Path, str, bool]:
    """``(weights folder, label, is_base_model)`` for a model name / folder / ``RUN[@STEP]``."""
    from trace_gym.checkpoint import RunDir
    from trace_gym.models import resolve_model

    path, _, step = spec.partition("@")
    run = Path(path)
    if (run / "config.yaml").exists() and (run / "checkpoints").exists():
        if step and not step.isdigit():
            raise ValueError(f"policy {spec!r}: the step after @ must be an integer")
        ckpt = RunDir(run).checkpoint_path(int(step) if step else None)
        return ckpt / "policy", f"{run.name}@{ckpt.name.split('-')[1]}", False
    if step:
        raise ValueError(f"policy {spec!r}: {path!r} is not a run directory (no config.yaml + checkpoints/)")
    return Path(resolve_model(path)), path, True


def _cache_dir(cfg: EvalConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    return Path(os.environ.get("TRACE_GYM_CACHE", Path.home() / ".cache" / "trace_gym")) / "eval"


def _data_path(cfg: EvalConfig, suite: str) -> str | None:
    if not cfg.data_dir:
        return None
    base = Path(cfg.data_dir)
    for candidate in (base / f"{suite}.jsonl", base / f"{suite}.parquet", base / f"{suite}.json", base / suite):
        if candidate.exists():
            return str(candidate)
    return None


def cache_key(cfg: EvalConfig, digest: str, suite: str) -> str:
    """The settings that determine a suite's numbers, hashed."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in ("policy", "suites", "out", "cache", "cache_dir", "progress", "engine_kwargs")}
    settings["env_kwargs"] = json.dumps(cfg.env_kwargs, sort_keys=True, default=str)
    settings.update(weights=digest, suite=suite, data_path=_data_path(cfg, suite))
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:32]


def evaluate_cached(cfg: EvalConfig, folder: Path, suite: str, engine: Any = None) -> tuple[dict[str, Any], Any]:
    """One suite's result for the weights in ``folder``: from the cache when the same weights
    and settings were evaluated before, else run (on ``engine``, built when ``None``) and
    stored. Returns ``(result, engine or None)``."""
    from evaluators import suites
    from trace_gym.engines import make_engine

    key = cache_key(cfg, weights_hash(folder), suite)
    cached = _cache_dir(cfg) / f"{key}.json"
    if cfg.cache and cached.exists():
        return json.loads(cached.read_text()) | {"cached": True}, engine
    if engine is None:
        engine = make_engine(cfg.engine, folder, **cfg.engine_kwargs)
    limits = {k: getattr(cfg, k) for k in ("max_turns", "max_turn_tokens", "max_episode_tokens") if getattr(cfg, k)}
    result = suites.evaluate(engine, suite, limit=cfg.limit or None, samples=cfg.samples,
                             temperature=cfg.temperature, seed=cfg.seed, pass_k=cfg.pass_k,
                             data_path=_data_path(cfg, suite), heldout_fraction=cfg.heldout_fraction,
                             progress=cfg.progress, agent_limits=limits, env_kwargs=cfg.env_kwargs)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(cached)
    return result | {"cached": False}, engine


def run_eval(cfg: EvalConfig, *, out: Any = None) -> list[dict[str, Any]]:
    """Evaluate every policy on every suite (cached); writes ``results.json`` and ``results.md``."""
    from trace_gym.models import quiet_third_party

    quiet_third_party()
    out = out or sys.stdout
    rows = []
    for spec in cfg.policy:
        folder, label, base = resolve_policy(spec)
        engine = None
        for suite in cfg.suites:
            result, engine = evaluate_cached(cfg, folder, suite, engine)
            result.update(policy=spec, label=("ReAct (no RL): " if base else "") + label,
                          weights_sha256=weights_hash(folder))
            rows.append(result)
        if engine is not None:
            engine.close()
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "results.json").write_text(json.dumps(rows, indent=2))
    text = format_results(rows)
    (Path(cfg.out) / "results.md").write_text(text + "\n")
    print(text, file=out)
    return rows


def format_results(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown table (plus the BFCL per-category tables)."""
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
    return "\n".join(parts)
