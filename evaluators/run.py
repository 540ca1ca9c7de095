"""``trace-gym eval`` and ``trace-gym train``: parse, look names up, call the library.

Both commands take ``--config FILE`` plus ``key=value`` overrides (typed by the config's
fields; ``trainer.lr=1e-5`` for the trainer section). Unknown keys and bad values fail
with one line before any model loads. This module is on the face side: it names env
families, strategies and suites, and hands resolved objects to ``trace_gym.train`` and
``evaluators.suites``.

Evaluation results are cached per (weights hash, suite, samples, seed, and every other
setting that changes the numbers) under ``$TRACE_GYM_CACHE/eval``, so a repeat is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from trace_gym.config import config_from_mapping, doc, parse_overrides, read_yaml


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


def weights_hash(folder: str | Path) -> str:
    """sha256 over the folder's ``*.safetensors`` files (names and bytes), memoised by size/mtime."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {str(folder)!r}")
    memo = folder / ".trace_gym_weights_hash.json"
    stamp = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    if memo.exists():
        try:
            saved = json.loads(memo.read_text())
            if saved.get("stamp") == stamp:
                return saved["sha256"]
        except (json.JSONDecodeError, KeyError):
            pass
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 22), b""):
                h.update(chunk)
    digest = h.hexdigest()
    try:
        memo.write_text(json.dumps({"stamp": stamp, "sha256": digest}))
    except OSError:
        pass  # a read-only model folder: just recompute next time
    return digest


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


# ---------------------------------------------------------------------- train: name lookups
def resolve_train_setup(cfg: Any) -> Any:
    """A :class:`trace_gym.train.TrainSetup` from the config's names (env family, strategy,
    data, eval suite); raises ``ValueError`` naming an unknown one. Loads no model."""
    from evaluators import suites
    from trace_gym.registry import resolve_env
    from trace_gym.strategies import STRATEGIES, shaped_strategies
    from trace_gym.datafiles import split_tasks
    from trace_gym.train import TrainSetup

    family = resolve_env(cfg.env, cfg.env_kwargs)  # a family short name or any registered env id
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}; known: {sorted(STRATEGIES)}")
    if cfg.data and cfg.data not in suites.TRAIN_DATA:
        raise ValueError(f"unknown training data {cfg.data!r}; known: {sorted(suites.TRAIN_DATA)} "
                         "(empty: the env family's own tasks)")
    if cfg.eval_every:
        suites.get_suite(cfg.eval_suite)
    strategy = shaped_strategies([cfg.strategy], group_size=cfg.group_size,
                                 continuations_per_root=cfg.continuations_per_root)[cfg.strategy]
    if cfg.data:
        source = suites.TRAIN_DATA[cfg.data]
        load = lambda: source.load(cfg.train_pool, seed=cfg.seed, path=cfg.data_path or None)  # noqa: E731
        offline = source.offline or bool(cfg.data_path)
        data_line = f"{cfg.data} ({cfg.data_path or source.description})"
    else:
        def load():
            size = int(cfg.train_pool / max(1e-9, 1 - cfg.heldout_fraction)) + 16
            while True:
                kept = split_tasks(family.load_tasks(size, seed=cfg.seed), "train", cfg.heldout_fraction)
                if len(kept) >= cfg.train_pool or size > 64 * cfg.train_pool:
                    return kept[: cfg.train_pool]
                size *= 2

        offline = True
        data_line = f"{family.task_loader} minus the held-out {cfg.heldout_fraction:.0%}"

    eval_cfg = EvalConfig(policy=(cfg.policy,), suites=(cfg.eval_suite,), limit=cfg.eval_tasks,
                          samples=cfg.eval_samples, temperature=0.0 if cfg.eval_samples == 1 else cfg.temperature,
                          seed=cfg.seed, engine=cfg.engine, heldout_fraction=cfg.heldout_fraction,
                          max_turns=cfg.max_turns, max_turn_tokens=cfg.max_turn_tokens,
                          max_episode_tokens=cfg.max_episode_tokens, env_kwargs=cfg.env_kwargs,
                          progress=cfg.progress)

    def evaluate(engine: Any, step: int) -> dict[str, Any]:
        if step == 0:  # the initial policy: the same cache as `trace-gym eval` with these settings
            from trace_gym.models import resolve_model

            return evaluate_cached(eval_cfg, Path(resolve_model(cfg.policy)), cfg.eval_suite, engine)[0]
        limits = {"max_turns": cfg.max_turns, "max_turn_tokens": cfg.max_turn_tokens,
                  "max_episode_tokens": cfg.max_episode_tokens}
        return suites.evaluate(engine, cfg.eval_suite, limit=cfg.eval_tasks, samples=cfg.eval_samples,
                               temperature=eval_cfg.temperature, seed=cfg.seed, heldout_fraction=cfg.heldout_fraction,
                               progress=cfg.progress, agent_limits=limits, env_kwargs=cfg.env_kwargs)

    return TrainSetup(strategy=strategy, make_env=family.make_env, load_train_tasks=load,
                      evaluate=evaluate if cfg.eval_every else None, data_offline=offline,
                      describe={"env": f"{cfg.env}: {family.env_id} {dict(family.env_kwargs)}", "data": data_line,
                                "eval": f"{cfg.eval_suite} every {cfg.eval_every} steps" if cfg.eval_every else "-"})


# ---------------------------------------------------------------------- argparse
def _overrides(items: Sequence[str]) -> dict[str, str]:
    return parse_overrides(items)


def cmd_train(args: argparse.Namespace) -> int:
    from trace_gym.train import dry_run, load_train_config, train

    items = list(args.overrides)
    if args.ray is not None and "=" in args.ray:  # `--ray steps=2`: the flag took an override
        items, args.ray = [args.ray, *items], "local"
    overrides = _overrides(items) | ({"ray": args.ray} if args.ray is not None else {})
    cfg = load_train_config(args.config, overrides)
    setup = resolve_train_setup(cfg)
    if args.dry_run:
        print(dry_run(cfg, setup))
        return 0
    result = train(cfg, setup)
    print(f"wrote {result['run_dir']}/metrics.jsonl ({len(result['metrics'])} steps)")
    return 0


def add_train_subcommand(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from trace_gym.config import config_help
    from trace_gym.train import TrainConfig
    from trace_gym.trainer import TrainerConfig

    fields = "\n".join(f"  {n} ({t}, default {d!r}): {h}" for n, t, d, h in config_help(TrainConfig) if n != "trainer")
    fields += "\n" + "\n".join(f"  trainer.{n} ({t}, default {d!r}): {h}" for n, t, d, h in config_help(TrainerConfig))
    p = subparsers.add_parser("train", help="train a policy with a rollout strategy (run dir, resume, eval)",
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="keys (YAML or key=value):\n" + fields.replace("%", "%%"))
    p.add_argument("--config", help="YAML file with TrainConfig keys (and a trainer: section)")
    p.add_argument("--dry-run", action="store_true", help="resolve config, data, env and strategy; load no model")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on Ray: start a local cluster, or join ADDRESS (auto, host:6379); docs/distributed.md")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. steps=8 trainer.lr=1e-5")
    p.set_defaults(func=cmd_train)
    return p


def cmd_eval(args: argparse.Namespace) -> int:
    data: dict[str, Any] = read_yaml(args.config) if args.config else {}
    data.update(_overrides(args.overrides))
    if args.policy:
        data["policy"] = args.policy
    if args.suite:
        data["suites"] = args.suite
    run_eval(config_from_mapping(EvalConfig, data, source=args.config or "eval"))
    return 0


def add_eval_subcommand(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from evaluators.suites import SUITES
    from trace_gym.config import config_help

    fields = "\n".join(f"  {n} ({t}, default {d!r}): {h}" for n, t, d, h in config_help(EvalConfig))
    suites = "\n".join(f"  {name}: {s.description}" for name, s in SUITES.items())
    p = subparsers.add_parser("eval", help="evaluate checkpoints on benchmark suites (cached)",
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=("suites:\n" + suites + "\nkeys (YAML or key=value):\n" + fields).replace("%", "%%"))
    p.add_argument("--policy", help="PATH | RUN[@STEP] | model name (comma-separated for several)")
    p.add_argument("--suite", help="NAME[,NAME...] (default: generated)")
    p.add_argument("--config", help="YAML file with EvalConfig keys")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. samples=4 temperature=1")
    p.set_defaults(func=cmd_eval)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m evaluators.cli {train,eval,compare} ...`` (what ``trace-gym`` runs once wired)."""
    from trace_gym.cli import configure_logging
    from trace_gym.compare import add_compare_subcommand

    parser = argparse.ArgumentParser(prog="trace-gym")
    parser.add_argument("--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_subcommand(sub)
    add_eval_subcommand(sub)
    add_compare_subcommand(sub)
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:
        print(f"trace-gym {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
