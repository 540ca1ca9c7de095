"""The ``trace-gym`` command line.

Subcommands come from one explicit table, :data:`SUBCOMMANDS`: name -> ``"module:function"``
where the function takes argparse's subparsers, adds its parser, and sets
``func=<callable(args) -> int>`` as the parser default. This module builds ``bench`` and
``envs`` itself; ``train``, ``eval``, ``index`` and ``models`` are added by their own
modules through the same table (an entry whose module does not exist yet, or fails to
import, still shows up in ``--help`` and explains itself when run).

``trace-gym bench --sim`` benchmarks every strategy of ``trace_gym.strategies.STRATEGIES``
(plus ``trace_learned``: TRACE with the online-learned predictor) on the simulator at one
nominal budget, over several seeds; see :class:`SimBenchConfig` for every knob.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

#: Subcommands added by other modules: name -> "module:add_parser_function".
SUBCOMMANDS: dict[str, str] = {
    "train": "trace_gym.trainer:add_train_subcommand",
    "eval": "evaluators.cli:add_eval_subcommand",
    "index": "retrieval_index.cli:add_index_subcommand",
    "models": "trace_gym.models:add_models_subcommand",
}

#: Name under which the bench reports TRACE with the learned predictor.
LEARNED = "trace_learned"


def _help(text: str) -> Any:
    return {"help": text}


@dataclass(frozen=True)
class SimBenchConfig:
    """``trace-gym bench --sim``: one frozen config; every field is a ``--flag``.

    The default is paper-like: a GRPO baseline with groups of 8 that are mixed about
    27 % of the time (DeepScaleR with Qwen3-8B), the (M, N) = (M, 2) tree shape the
    paper found best, and a candidate pool as large as the root budget so the root
    stage can skip most prompts (the paper skipped 65-71 %).
    """

    seeds: int = field(default=3, metadata=_help("independent seeds (a fresh task pool each)"))
    steps: int = field(default=5, metadata=_help("allocation steps per seed (a fresh candidate pool each)"))
    warmup_steps: int = field(
        default=1, metadata=_help("first steps run (the learned predictor trains) but not measured")
    )
    pool_size: int = field(default=4096, metadata=_help("simulated tasks in the dataset"))
    candidates: int = field(default=256, metadata=_help("candidate prompts scored per step"))
    root_budget: int = field(default=256, metadata=_help("M: root rollouts of a tree strategy per step"))
    continuations_per_root: int = field(
        default=2, metadata=_help("N: continuations per root; nominal budget = M (1 + N/2)")
    )
    group_size: int = field(default=8, metadata=_help("G: group size of the uniform and PCL baselines"))
    predictor: str = field(default="oracle", metadata=_help("predictor for every strategy: oracle | noisy"))
    noisy_spearman: float = field(default=0.8, metadata=_help("prompt-level Spearman of the noisy oracle"))
    strategies: tuple[str, ...] = field(
        default=(), metadata=_help("comma-separated strategy names (default: all, plus trace_learned)")
    )
    target_mixed: float = field(default=0.27, metadata=_help("P(uniform group of G is mixed) to calibrate to"))
    mean_success: float = field(default=0.5, metadata=_help("mean task success probability"))
    step_concentration: float = field(default=3.0, metadata=_help("kappa of the per-turn beta-splitting martingale"))
    demo_values: tuple[float, ...] = field(
        default=(0.99, 0.9, 0.5, 0.5, 0.15, 0.02), metadata=_help("predicted values of the root-allocation demo")
    )
    demo_budgets: tuple[int, ...] = field(
        default=(2, 4, 8, 12, 16, 24, 32, 48, 64), metadata=_help("root budgets of the root-allocation demo")
    )

    def __post_init__(self) -> None:
        for name in ("seeds", "steps", "pool_size", "candidates", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must lie in [0, steps={self.steps}), got {self.warmup_steps!r}")
        if self.candidates > self.pool_size:
            raise ValueError(f"candidates {self.candidates} exceed pool_size {self.pool_size}")
        if self.root_budget < 2 or self.continuations_per_root < 0:
            raise ValueError(
                f"need root_budget >= 2 and continuations_per_root >= 0, got "
                f"{self.root_budget!r}, {self.continuations_per_root!r}"
            )
        if self.predictor not in ("oracle", "noisy"):
            raise ValueError(f"predictor must be 'oracle' or 'noisy', got {self.predictor!r}")

    @property
    def nominal_budget(self) -> float:
        from trace_gym.budget import nominal_cost

        return nominal_cost(self.root_budget, self.continuations_per_root)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> "SimBenchConfig":
        """Build from a dict (e.g. YAML), rejecting unknown keys by name."""
        from trace_gym.bench_env import config_from_mapping

        return config_from_mapping(cls, data)


# ---------------------------------------------------------------------- the bench
def _strategy_table(cfg: SimBenchConfig) -> dict[str, Any]:
    """The strategies to run, shaped for this config (group size G, tree shape N)."""
    from trace_gym.strategies import STRATEGIES, shaped_strategies

    return shaped_strategies(cfg.strategies, group_size=cfg.group_size,
                             continuations_per_root=cfg.continuations_per_root,
                             extra={LEARNED: STRATEGIES["trace"]})


def _predictor(name: str, cfg: SimBenchConfig, world, pool, seed: int):
    from trace_gym import sim, sim_predictors

    if name == LEARNED:
        return sim_predictors.LearnedPredictor(pool.features)
    if cfg.predictor == "noisy":
        return sim_predictors.NoisyOraclePredictor.with_spearman(cfg.noisy_spearman, world, seed=seed)
    return sim_predictors.OraclePredictor()


def run_sim_bench(cfg: SimBenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the simulated allocation benchmark; returns the JSON-ready results.

    Every strategy sees the same task pools and candidate draws (common random numbers
    per seed and step) and spends the same nominal budget M (1 + N/2) per step.
    Per seed, metrics pool the measured steps (after ``warmup_steps``); the table
    reports mean and std over seeds.
    """
    from trace_gym import report, sim
    from trace_gym.allocation import solve_root
    from trace_gym.budget import BudgetLedger

    t_start = time.perf_counter()
    world = sim.SimWorld(
        target_mixed=cfg.target_mixed,
        mean_success=cfg.mean_success,
        group_size=cfg.group_size,
        step_concentration=cfg.step_concentration,
    )
    strategies = _strategy_table(cfg)
    budget = cfg.nominal_budget
    per_seed: dict[str, list[dict[str, Any]]] = {n: [] for n in strategies}
    depth_pairs: dict[str, dict[int, float]] = {n: {} for n in strategies}
    for seed in range(cfg.seeds):
        pool = sim.make_pool(world, cfg.pool_size, np.random.default_rng([seed, 0]))
        draws = [
            np.random.default_rng([seed, 1, step]).choice(cfg.pool_size, cfg.candidates, replace=False)
            for step in range(cfg.steps)
        ]
        for name, strategy in strategies.items():
            rng = np.random.default_rng([seed, 2, zlib.crc32(name.encode())])
            predictor = _predictor(name, cfg, world, pool, seed)
            ledger = BudgetLedger()
            trees, preds, truth = [], [], []
            prefix_pred, prefix_true, prefix_depth = [], [], []
            for step, cands in enumerate(draws):
                step_ledger = BudgetLedger()
                step_trees, values, _ = sim.run_step(pool, cands, strategy, predictor, budget, world, rng, step_ledger)
                if step >= cfg.warmup_steps:
                    # predictor quality on every visited prefix, before it trains on them
                    states = [n.snapshot for t in step_trees for n in t.nodes[1:] if not n.terminal]
                    prefix_pred.append(predictor.predict(states) if states else np.zeros(0))
                    prefix_true.append(np.array([st.value for st in states]))
                    prefix_depth.append(np.array([st.turn for st in states], dtype=int))
                with step_ledger.phase("predictor_update"):
                    predictor.update(*sim.training_examples(step_trees))
                if step >= cfg.warmup_steps:
                    ledger = ledger.merge(step_ledger)
                    trees += step_trees
                    preds.append(values)
                    truth.append(pool.success[cands])
            n = cfg.steps - cfg.warmup_steps
            pairs = report.contrast_pairs_by_depth(trees)
            for d, c in pairs.items():
                depth_pairs[name][d] = depth_pairs[name].get(d, 0.0) + c / n / cfg.seeds
            per_seed[name].append(
                {
                    "effective_ratio": report.effective_ratio(trees),
                    "contrast_pairs_per_unit": sum(pairs.values()) / ledger.nominal,
                    "distinct_prompts": len(trees) / n,
                    "rollouts_per_prompt": ledger.rollouts / max(1, len(trees)),
                    "nominal_cost": ledger.nominal / n,
                    "rollouts": ledger.rollouts / n,
                    "continuations": ledger.continuations / n,
                    "env_steps": ledger.env_steps / n,
                    "generated_tokens": ledger.generated_tokens / n,
                    "prefill_tokens": ledger.prefill_tokens / n,
                    "allocator_ms": 1e3 * ledger.seconds.get("allocation", 0.0) / n,
                    "prompt_spearman": report.spearman(np.concatenate(preds), np.concatenate(truth)),
                    "prefix_spearman": report.spearman(np.concatenate(prefix_pred), np.concatenate(prefix_true)),
                    "prefix_spearman_by_depth": {
                        str(d): rho
                        for d, rho in report.spearman_by_depth(
                            np.concatenate(prefix_pred), np.concatenate(prefix_true), np.concatenate(prefix_depth)
                        ).items()
                    },
                }
            )
        if progress:
            progress(f"seed {seed + 1}/{cfg.seeds} done ({time.perf_counter() - t_start:.1f} s)")

    results: dict[str, Any] = {"config": dataclasses.asdict(cfg), "nominal_budget": budget, "strategies": {}}
    for name, rows in per_seed.items():
        entry: dict[str, Any] = {"description": strategies[name].description}
        if name == LEARNED:
            entry["description"] = "TRACE with the online-learned predictor (logistic regression on tree targets)"
        for key in rows[0]:
            if isinstance(rows[0][key], dict):
                continue  # per-seed detail only (in "per_seed")
            mean, std = report.mean_std([r[key] for r in rows])
            entry[key], entry[key + "_std"] = mean, std
        entry["per_seed"] = rows
        entry["contrast_pairs_by_depth"] = {str(d): v for d, v in sorted(depth_pairs[name].items())}
        results["strategies"][name] = entry
    results["root_allocation_demo"] = {
        "values": list(cfg.demo_values),
        "budgets": list(cfg.demo_budgets),
        "allocations": [solve_root(np.array(cfg.demo_values), b).tolist() for b in cfg.demo_budgets],
    }
    results["checks"] = bench_checks(results)
    results["seconds"] = time.perf_counter() - t_start
    return results


def bench_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The foundation's done-when, evaluated on the run's own numbers.

    Each check is ``{"name", "status": PASS | FAIL | SKIP, "detail"}``; SKIP when a
    strategy it needs was not run.
    """
    s = results["strategies"]
    eff = {n: v["effective_ratio"] for n, v in s.items()}
    checks: list[dict[str, Any]] = []

    def check(name: str, needs: Sequence[str], ok: Callable[[], bool], detail: Callable[[], str]) -> None:
        if any(n not in eff for n in needs):
            checks.append({"name": name, "status": "SKIP", "detail": f"needs {', '.join(needs)}"})
        else:
            checks.append({"name": name, "status": "PASS" if ok() else "FAIL", "detail": detail()})

    check(
        "trace effective ratio >= 2x uniform",
        ["trace", "uniform"],
        lambda: eff["trace"] >= 2 * eff["uniform"],
        lambda: f"{eff['trace']:.3f} vs 2 x {eff['uniform']:.3f} = {2 * eff['uniform']:.3f}",
    )
    for ab in ("trace_root_only", "trace_prefix_only"):
        check(
            f"{ab} between uniform and trace",
            ["uniform", ab, "trace"],
            lambda ab=ab: eff["uniform"] < eff[ab] < eff["trace"],
            lambda ab=ab: f"{eff['uniform']:.3f} < {eff[ab]:.3f} < {eff['trace']:.3f}",
        )
    check(
        "random_tree below trace",
        ["random_tree", "trace"],
        lambda: eff["random_tree"] < eff["trace"],
        lambda: f"{eff['random_tree']:.3f} < {eff['trace']:.3f}",
    )
    check(
        "trace_learned reported",
        [LEARNED],
        lambda: math.isfinite(eff[LEARNED]),
        lambda: f"effective ratio {eff[LEARNED]:.3f}",
    )
    costs = {n: v["nominal_cost"] for n, v in s.items()}
    check(
        "equal nominal budget",
        list(costs)[:1],
        lambda: max(costs.values()) - min(costs.values()) <= 1e-9 * max(1.0, results["nominal_budget"]),
        lambda: f"per step: {sorted(set(round(c, 6) for c in costs.values()))} (budget {results['nominal_budget']:g})",
    )
    return checks


def format_bench(results: dict[str, Any]) -> str:
    """The printed report: strategy table, checks, root-allocation demo (markdown)."""
    from trace_gym.report import markdown_table, pm

    cfg = results["config"]
    rows = []
    for name, r in results["strategies"].items():
        rows.append(
            [
                name,
                pm(r["effective_ratio"], r["effective_ratio_std"]),
                r["contrast_pairs_per_unit"],
                r["distinct_prompts"],
                r["rollouts_per_prompt"],
                r["nominal_cost"],
                f"{r['rollouts']:.0f} + {r['continuations']:.0f}/2",
                r["env_steps"],
                r["generated_tokens"],
                r["prefill_tokens"],
                r["allocator_ms"],
                r["prompt_spearman"],
                r["prefix_spearman"],
            ]
        )
    headers = [
        "strategy", "effective ratio", "pairs/unit", "prompts", "roots/prompt", "nominal",
        "rollouts + cont./2", "env steps", "gen tokens", "prefill tokens", "alloc ms", "Spearman prompt", "Spearman prefix",
    ]  # fmt: skip
    out = [
        f"## Simulated allocation benchmark ({cfg['seeds']} seeds x {cfg['steps'] - cfg['warmup_steps']} "
        f"measured steps; predictor: {cfg['predictor']}; {results['seconds']:.1f} s)",
        "",
        f"Nominal budget per step: {results['nominal_budget']:g} trajectory-equivalents = M (1 + N/2) with "
        f"M = {cfg['root_budget']}, N = {cfg['continuations_per_root']}; candidates per step: "
        f"{cfg['candidates']}; baseline group size {cfg['group_size']}. Per-step means; effective ratio "
        "is mean ± std over seeds.",
        "",
        markdown_table(headers, rows),
        "",
        "### Checks",
        "",
    ]
    out += [f"{c['status']}: {c['name']} ({c['detail']})" for c in results["checks"]]
    demo = results["root_allocation_demo"]
    out += ["", "### Root allocation demo (TRACE solve_root, m_i per budget)", ""]
    demo_rows = [[b, *m, sum(m)] for b, m in zip(demo["budgets"], demo["allocations"])]
    out.append(markdown_table(["budget", *[f"v={v:g}" for v in demo["values"]], "sum"], demo_rows))
    return "\n".join(out)


def write_bench_plots(results: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """effective_ratio.png, contrast_pairs_by_depth.png, root_allocation.png in ``out_dir``."""
    from trace_gym import report

    out = Path(out_dir)
    s = results["strategies"]
    names = list(s)
    uniform = s.get("uniform", {}).get("effective_ratio")
    paths = [
        report.plot_bars(
            names,
            [s[n]["effective_ratio"] for n in names],
            [s[n]["effective_ratio_std"] for n in names],
            out / "effective_ratio.png",
            ylabel="effective ratio",
            title=f"Effective ratio at nominal budget {results['nominal_budget']:g}",
            hline=(2 * uniform, "2 x uniform") if uniform is not None else None,
        ),
        report.plot_grouped(
            {n: {int(d): v for d, v in s[n]["contrast_pairs_by_depth"].items()} for n in names},
            out / "contrast_pairs_by_depth.png",
            xlabel="anchor depth",
            ylabel="contrast pairs per step",
            title="Contrast pairs by anchor depth",
        ),
    ]
    demo = results["root_allocation_demo"]
    paths.append(report.plot_root_allocation(demo["values"], demo["budgets"], demo["allocations"], out / "root_allocation.png"))
    return paths


# ---------------------------------------------------------------------- argparse
def _parse_field(f: dataclasses.Field, text: str) -> Any:
    if f.type in ("tuple[str, ...]",):
        return tuple(x.strip() for x in text.split(",") if x.strip())
    if f.type == "tuple[float, ...]":
        return tuple(float(x) for x in text.split(","))
    if f.type == "tuple[int, ...]":
        return tuple(int(x) for x in text.split(","))
    return {"int": int, "float": float, "str": str}[f.type](text)


def _add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: set[str] = frozenset()) -> None:
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=f.type.split("[")[0].upper(),
            help=f"{f.metadata.get('help', '')} (default: {f.default!r})",
        )


def config_from_args(args: argparse.Namespace, cls: type = SimBenchConfig) -> Any:
    """YAML (``--config``) first, then every explicitly given ``--flag`` on top."""
    data: dict[str, Any] = {}
    if getattr(args, "config", None):
        import yaml

        loaded = yaml.safe_load(Path(args.config).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {args.config} must hold a mapping, got {type(loaded).__name__}")
        data.update(loaded)
    for f in dataclasses.fields(cls):
        raw = getattr(args, f.name, None)
        if raw is not None:
            try:
                data[f.name] = _parse_field(f, raw)
            except ValueError as exc:
                raise ValueError(f"--{f.name.replace('_', '-')}: cannot parse {raw!r} as {f.type}") from exc
    return cls.from_mapping(data)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.sim == bool(args.env):
        print("trace-gym bench: give exactly one of --sim or --env ENV (with --policy MODEL)", file=sys.stderr)
        return 2
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.env:
        from trace_gym.bench_env import EnvBenchConfig, format_env_bench, run_env_bench

        results = run_env_bench(config_from_args(args, EnvBenchConfig), progress=progress)
        print(format_env_bench(results))
    else:
        results = run_sim_bench(config_from_args(args), progress=progress)
        if args.out:
            results["plots"] = [str(p) for p in write_bench_plots(results, args.out)]
        print(format_bench(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"\nwrote {args.json}")
    if args.out:
        print(f"wrote plots: {', '.join(results['plots'])}")
    failed = [c for c in results.get("checks", []) if c["status"] == "FAIL"]
    return 1 if failed and args.strict else 0


def cmd_envs(args: argparse.Namespace) -> int:
    from trace_gym.registry import env_ids

    for env_id in env_ids():
        print(env_id)
    return 0


def _add_bench(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="benchmark allocation strategies at equal nominal budget")
    p.add_argument("--sim", action="store_true", help="use the simulator (no model needed)")
    p.add_argument("--config", help="YAML file with SimBenchConfig / EnvBenchConfig fields (flags override it)")
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--out", help="write PNG plots into this folder")
    p.add_argument("--strict", action="store_true", help="exit 1 when a check FAILs")
    _add_config_flags(p, SimBenchConfig)
    from trace_gym.bench_env import EnvBenchConfig

    _add_config_flags(p, EnvBenchConfig, skip={f.name for f in dataclasses.fields(SimBenchConfig)})
    p.set_defaults(func=cmd_bench)


def _add_envs(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("envs", help="list registered environment ids")
    p.set_defaults(func=cmd_envs)


def _add_unavailable(subparsers: argparse._SubParsersAction, name: str, help_text: str, reason: str) -> None:
    p = subparsers.add_parser(name, help=help_text, add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: print(reason, file=sys.stderr) or 2)


def _add_external(subparsers: argparse._SubParsersAction, name: str, target: str) -> None:
    """Import ``target`` and let it add its parser; explain instead when it cannot load."""
    module, _, function = target.partition(":")
    try:
        add = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        reason = f"trace-gym {name}: not available yet ({target} could not be loaded: {exc})"
        _add_unavailable(subparsers, name, f"(not available: {module})", reason)
        return
    add(subparsers)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser. Only the external subcommand named in ``argv`` is imported
    (so ``trace-gym bench`` never imports the trainer); the others are listed by name."""
    parser = argparse.ArgumentParser(prog="trace-gym", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,envs," + ",".join(SUBCOMMANDS) + "}")
    _add_bench(sub)
    _add_envs(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    requested = next((a for a in argv if not a.startswith("-")), None)
    for name, target in SUBCOMMANDS.items():
        if name == requested:
            _add_external(sub, name, target)
        else:
            _add_unavailable(sub, name, f"see `trace-gym {name} --help` ({target.partition(':')[0]})", "unreachable")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad configuration or input: say what, without a traceback
        print(f"trace-gym {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
