"""``trace-gym bench --bank FILE``: a rollout bank as a :class:`~trace_gym.bench.loop.BenchSource`.

Each repetition (seed) draws its candidate pools from the bank's prompts (disjoint
pools until the bank is used up, then a fresh permutation: an epoch), and every arm
replays them through the one step driver with a
:class:`~trace_gym.banks.replay.BankBranchRunner`: recorded roots and continuations are
drawn without replacement, and a request beyond what was recorded is refused
(``exhausted``), never invented. The draws persist across an arm's steps (a prompt
drawn again gets further unused rollouts) and are seeded per repetition, so every arm
of a repetition sees the same recorded rollouts for the same requests.

Predictors: every text kind of :data:`~trace_gym.predictor.kinds.PREDICTORS`, warmed up once
per repetition on a held-out slice of the bank drawn afresh for that repetition
(:mod:`trace_gym.banks.warmup`: the same slice and the same warm predictor for every arm,
a slice no measured pool of the repetition draws from, charged to no arm; so the interval
over repetitions covers which prompts warm the predictor and which are measured), then
copied to each arm and learning online across the replayed steps from the recorded texts
(the LM critic reads the policy named in the bank's manifest); and, as an upper bound labelled
as one, TRACE with the bank's empirical rates (:class:`~trace_gym.banks.replay.BankOraclePredictor`).
Each step hands the bench the candidates' empirical rates and whether their recorded roots were mixed (the truth of
the predictor-quality measures). Besides the shared metrics, a row holds the
predictor's Spearman over every recorded prefix it scored before training on it
(overall and by depth),
the exhausted share, the bank sizes the arm needed (roots per prompt, continuations
per prefix), and the prefixes left out by the recording's per-root cap. When any
arm's exhausted share exceeds 1 %, the bench gives no verdict
(:func:`trace_gym.bench.checks.exhaustion_check`).

Sizes: ``candidates`` and ``root_budget`` left unset are sized to a bank smaller than the
defaults assume (:func:`bank_sizes`, one line saying so); a size given that the bank cannot
hold is refused before the bench starts, naming the largest that fit (:func:`bank_sizes`,
:func:`check_groups_fit`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trace_gym.banks.format import Bank, open_bank
from trace_gym.banks.replay import BankBranchRunner, BankDraws, BankOraclePredictor, recorded_prefix_rate
from trace_gym.bench.loop import Arm, arms_with_oracle, run_bench
from trace_gym.bench.modes import BenchMode
from trace_gym.banks.warmup import held_out_prompts, repetition_seed, warm_up, warmup_batches
from trace_gym.step.driver import StepResult, run_step
from trace_gym.bench.config import BankBenchConfig
from trace_gym.predictor.kinds import PREDICTORS, make_predictor
from trace_gym.allocation.strategy import Strategy

#: The oracle arm's predictor name (not a kind of the predictor table: it reads the bank).
ORACLE = "oracle"


@dataclass
class BankRepetition:
    """One repetition: its candidate pools, a fresh (warm) predictor per arm, and each arm's draws from
    the bank (``draws``: the runner state a step changes, kept here from step to step)."""

    source: BankSource
    rep: int

    def __post_init__(self) -> None:
        cfg, source = self.source.config, self.source
        self.seed = repetition_seed(cfg.seed, self.rep)
        self.label = f"seed {self.seed}"
        rng = np.random.default_rng([cfg.seed, self.rep, 0])
        self.held_out, measurable = source.split(self.rep)
        order: list[int] = []
        self.pools = []
        for _ in range(cfg.steps):  # epochs: disjoint pools until the measurable prompts are used up
            if len(order) < cfg.candidates:
                order = [measurable[i] for i in rng.permutation(len(measurable))]
            self.pools.append(order[:cfg.candidates])
            order = order[cfg.candidates:]
        self._templates: dict[str, Any] = {}  # predictor kind -> its warm predictor of this repetition
        self.draws: dict[str, BankDraws] = {}

    def candidates(self, step: int) -> list:
        return [self.source.bank.prompt(i) for i in self.pools[step]]

    def predictor(self, arm: Arm) -> Any:
        self.draws[arm.name] = BankDraws(self.seed)  # every arm draws the same rollouts for the same requests
        if arm.predictor == ORACLE:
            return BankOraclePredictor()
        if arm.predictor not in self._templates:  # built and warmed up once per kind and repetition
            cfg, source = self.source.config, self.source
            kwargs = cfg.predictor_kwargs if arm.predictor == cfg.predictor else {}
            template = make_predictor(arm.predictor, kwargs, model_path=source.policy_path, seed=self.seed)
            if self.held_out:
                stats = warm_up(template, source.bank, self.held_out, seed=cfg.seed, prefix_share=cfg.prefix_share,
                                batches=source.warmup_batches(self.held_out))
                if arm.predictor == cfg.predictor:
                    source.warmups.append(stats)
            self._templates[arm.predictor] = template
        return copy.deepcopy(self._templates[arm.predictor])  # each arm gets a pristine copy

    def arm_state(self, arm: Arm) -> BankDraws:
        return self.draws[arm.name]

    def set_arm_state(self, arm: Arm, state: BankDraws) -> None:
        self.draws[arm.name] = state

    def rng(self, arm: Arm) -> np.random.Generator:
        return np.random.default_rng([self.seed, 2, zlib.crc32(arm.name.encode())])

    def step(self, arm: Arm, candidates: Sequence[Any], predictor: Any, budget: float,
             rng: np.random.Generator, *, measured: bool, play: Any) -> StepResult:
        d = self.draws[arm.name]
        runner = BankBranchRunner(d, anchored=arm.predictor == ORACLE)
        cfg = self.source.config
        result = run_step(candidates, play.strategy, predictor, runner, budget, rng, prefix_share=cfg.prefix_share,
                          score_prefixes=measured, mixed_rule=cfg.mixed(), **play.kwargs())
        result.extras.update(records=list(candidates), roots_needed=d.roots_needed,
                             continuations_needed=d.continuations_needed, truth=bank_truth(candidates, cfg.mixed()))
        return result

    def measure(self, arm: Arm, steps: Sequence[StepResult]) -> dict[str, Any]:
        from trace_gym import report

        pp, pt, pd = [], [], []
        for s in steps:
            learning = s.learning
            prefix = learning.depths > 0
            for pred, t, node in zip(learning.prefix_predictions, learning.tree_index[prefix],
                                     learning.node_ids[prefix]):
                record, tree = s.extras["records"][s.tree_candidates[t]], s.trees[t]
                rate = recorded_prefix_rate(record, tree, int(node))
                if rate is not None:
                    pp.append(pred)
                    pt.append(rate)
                    pd.append(tree.nodes[node].depth)
        requested = sum(s.ledger.rollouts + s.ledger.continuations for s in steps)
        exhausted = sum(s.ledger.exhausted for s in steps)
        left_out = sum(1 for s in steps for t in s.trees for n in t.nodes[1:]
                       if not n.terminal and "prefix" not in n.info["bank"] and not n.info["bank"]["recorded"])
        truncations: dict[str, int] = {}
        for s in steps:
            for t in s.trees:
                for n in t.nodes[1:]:
                    if "truncation" in n.info:
                        truncations[n.info["truncation"]] = truncations.get(n.info["truncation"], 0) + 1
        leaves = [leaf.reward for s in steps for t in s.trees for leaf in t.leaves()]
        return {"prefix_spearman": report.spearman(pp, pt),
                "prefix_spearman_within": report.spearman_within(pp, pt, pd),
                "prefix_spearman_by_depth": {str(d): r for d, r in report.spearman_by_depth(pp, pt, pd).items()},
                "scored_prefixes": len(pp) / len(steps),
                "exhausted_share": exhausted / max(requested, 1),
                "exhausted": exhausted / len(steps),
                "roots_needed": steps[-1].extras["roots_needed"],
                "continuations_needed": steps[-1].extras["continuations_needed"],
                "left_out_prefixes": left_out / len(steps),
                "mean_reward": float(np.mean(leaves)) if leaves else math.nan,
                "truncations": truncations}

    def after_arm(self, arm: Arm, steps: Sequence[StepResult]) -> None:
        from trace_gym import report

        trees = [t for s in steps for t in s.trees]
        self.source.say(f"{self.label}: {arm.name} done, effective ratio "
                        f"{report.effective_ratio(trees, self.source.config.mixed()):.2f}")


@dataclass
class BankSource:
    """A rollout bank as a bench source (see the module docstring).

    Attributes:
        config: the bench config (``config.bank`` is the file).
        say: receives one-line progress messages.
    """

    config: BankBenchConfig
    say: Callable[[str], None] = lambda msg: None
    mode: str = "bank"
    bank: Bank = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        if not cfg.bank:
            raise ValueError("bench --bank needs a bank file (bank=FILE); record one with trace-gym bank record")
        self.bank = open_bank(cfg.bank, cache_prompts=max(4 * (cfg.candidates or DEFAULT_CANDIDATES), 256))
        self.warmup_count = warmup_size(cfg, len(self.bank))
        self.held_out, self.measurable = self.split(0)
        candidates, root_budget, note = bank_sizes(cfg, len(self.bank), len(self.held_out))
        if note:
            self.say(note)
        self.config = cfg = dataclasses.replace(cfg, candidates=candidates, root_budget=root_budget)
        if cfg.epochs:  # every measured prompt visited `epochs` times (the pools cycle through them)
            steps = cfg.warmup_steps + math.ceil(cfg.epochs * len(self.measurable) / cfg.candidates)
            self.config = cfg = dataclasses.replace(cfg, steps=steps)
        self.warmups: list[dict[str, Any]] = []
        self._warmup_batches: tuple[tuple[int, ...], list] | None = None
        self.repetitions, self.steps, self.warmup_steps = cfg.seeds, cfg.steps, cfg.warmup_steps
        self.budget_unit, self.nominal_budget = cfg.budget_unit, cfg.nominal_budget
        self.policy_path = None
        if "model_path" in PREDICTORS[cfg.predictor].needs:  # the critic reads the recorded policy's own LM
            self.policy_path = policy_folder(self.bank.manifest)

    def split(self, rep: int) -> tuple[list[int], list[int]]:
        """``(held_out, measurable)`` of repetition ``rep``: its warm-up slice, drawn afresh for each
        repetition (seeded by the repetition's seed, :func:`~trace_gym.banks.warmup.repetition_seed`),
        and the prompts its pools draw from. A slice fixed for the whole run would leave its choice
        out of the interval: on the math bank two base seeds gave PCL 0.729 +- 0.047 and 0.638 +-
        0.033 (docs/benchmarking.md)."""
        held = held_out_prompts(len(self.bank), self.warmup_count, repetition_seed(self.config.seed, rep))
        skip = set(held)
        return held, [i for i in range(len(self.bank)) if i not in skip]

    def warmup_batches(self, held_out: Sequence[int]) -> list:
        """The warm-up's trees of the slice ``held_out`` (:func:`trace_gym.banks.warmup.warmup_batches`),
        built once and read by every predictor kind's warm-up of its repetition (the last slice kept)."""
        key = tuple(held_out)
        if self._warmup_batches is None or self._warmup_batches[0] != key:
            self._warmup_batches = key, warmup_batches(self.bank, held_out, self.config.seed)
        return self._warmup_batches[1]

    def arms(self, strategies: Mapping[str, Strategy]) -> dict[str, Arm]:
        cfg = self.config
        check_groups_fit(cfg, strategies, len(self.measurable))
        return arms_with_oracle(strategies, cfg.predictor, ORACLE if cfg.oracle_upper_bound else None)

    def repetition(self, rep: int) -> BankRepetition:
        return BankRepetition(self, rep)

    def results(self, strategies: Mapping[str, Strategy]) -> dict[str, Any]:
        m = self.bank.manifest
        keys = ("policy", "policy_path", "weights_sha256", "env_id", "env_kwargs", "roots", "continuations",
                "max_prefixes_per_root", "seed", "sampling")
        return {"bank": {"path": str(self.bank.path), "prompts": len(self.bank), **{k: m.get(k) for k in keys},
                         "sha256": self.bank.scan.sha256},
                "warmup": self.warmup_summary()}

    def warmup_summary(self) -> dict[str, Any]:
        """What every learned predictor saw before step 0 (the same for every arm), and one line saying it."""
        cfg = self.config
        if not self.held_out:
            return {"prompts": 0, "description": "no warm-up: every learned predictor starts cold at step 0"
                    + (f"; the first {cfg.warmup_steps} step(s) are run but not measured" if cfg.warmup_steps else "")}
        w = self.warmups[0] if self.warmups else {}
        text = (f"every learned predictor first trained on {len(self.held_out)} held-out prompts (a slice drawn "
                f"afresh for each repetition, outside every measured pool of that repetition): their recorded rollouts"
                + (f" ({w['roots']} roots, {w['continuations']} continuations; {w['updates']} updates)" if w else "")
                + "; the same warm predictor for every arm, charged to no arm")
        if cfg.warmup_steps:
            text += f"; then {cfg.warmup_steps} step(s) run but not measured"
        return {**w, "indices": list(self.held_out), "per_repetition": True, "description": text}


def run_bank_bench(cfg: BankBenchConfig, strategies: Mapping[str, Strategy], *, progress: bool = False,
                   say: Callable[[str], None] | None = None, out_dir: str | None = None) -> dict[str, Any]:
    """Replay every strategy on a rollout bank (:func:`~trace_gym.bench.loop.run_bench` over a
    :class:`BankSource`); returns JSON-ready results.

    Args:
        cfg: the configuration (``cfg.bank`` is the file).
        strategies: name -> strategy, already shaped for ``cfg`` (plugins included).
        progress: show a progress bar.
        say: receives one-line progress messages and the all-same-reward warnings.
        out_dir: unused (the bank bench writes no files of its own).

    With ``cfg.embedding_cache`` the frozen encoder's calls go through the bank's store on
    disk (:func:`trace_gym.predictor.embeddings.bank_store`: the same vectors, read instead of computed
    when this exact call was made before); ``results["embedding_cache"]`` says how many calls
    it read and computed (``None`` with the cache off).
    """
    from trace_gym.predictor.embeddings import bank_store, use_store

    source = BankSource(cfg, say or (lambda msg: None))
    with use_store(bank_store(source.bank.scan.sha256) if cfg.embedding_cache else None) as store:
        results = run_bench(source, strategies, progress=progress, say=say)
    return results | {"embedding_cache": store.summary() if store is not None else None}


def intro(results: Mapping[str, Any]) -> list[str]:
    """The report's title and description of a bank bench."""
    from trace_gym.bench.report import applies_to, budget_note, interval_note

    cfg, bank = results["config"], results["bank"]
    measured = f"{cfg['seeds']} seeds x {cfg['steps'] - cfg['warmup_steps']} measured steps"
    return [f"## Allocation benchmark on a rollout bank: {bank['env_id']} with {bank['policy'] or '?'} "
            f"({measured}; {results['seconds']:.1f} s)", "",
            f"Bank {bank['path']}: {bank['prompts']} prompts, R = {bank['roots']} recorded roots each, "
            f"K = {bank['continuations']} continuations per recorded prefix (per-root cap "
            f"{bank['max_prefixes_per_root'] or 'none'}); outcomes replayed without replacement, a request "
            f"beyond them refused ('exhausted'). Budget per step: {budget_note(results)}, M = {cfg['root_budget']}, "
            f"N = {cfg['continuations_per_root']}; {cfg['candidates']} candidates per step; group size "
            f"{cfg['group_size']} ({applies_to(results)}). Headline predictor: {cfg['predictor']} (learned online "
            f"on the recorded texts); rows marked 'upper bound' use the bank's empirical rates. Predictor quality: "
            f"against the bank's empirical rates. Per-step means; effective ratio: {interval_note(results)}."]


MODE = BenchMode("bank", BankBenchConfig, run_bank_bench, intro, "replay a recorded rollout bank (a file, or a "
                 "shipped bank's name: trace-gym bank list)", value="bank", metavar="FILE",
                 columns=(("Spearman prefix", "prefix_spearman"), ("exhausted", "exhausted_share"),
                          ("left-out prefixes", "left_out_prefixes"), ("errors", "episode_errors"),
                          ("mean reward", "mean_reward")))


#: The warm-up slice when ``warmup_prompts`` is not given: this many prompts, at most a quarter of the bank.
DEFAULT_WARMUP_PROMPTS = 64
#: ``candidates`` and ``root_budget`` when not given, where the bank holds them (:func:`bank_sizes`).
DEFAULT_CANDIDATES, DEFAULT_ROOT_BUDGET = 64, 16


def groups_needed(roots: int, group_size: int) -> int:
    """Prompts that ``roots`` root rollouts in fixed groups of ``group_size`` take (the rule of
    :func:`baselines.uniform.fixed_groups`: a remainder of 2 or more is one more group, a
    remainder of 1 joins the last group)."""
    q, r = divmod(int(roots), int(group_size))
    return q + (r >= 2)


def largest_root_budget(candidates: int, group_size: int, continuations_per_root: int) -> int:
    """The largest M whose nominal budget ``M (1 + N/2)``, spent as root rollouts in fixed
    groups of ``group_size`` (uniform, PCL), takes at most ``candidates`` prompts; 1 when
    not even M = 2 fits."""
    from trace_gym.budget import nominal_cost

    m = 1
    while groups_needed(math.floor(nominal_cost(m + 1, continuations_per_root) + 1e-9), group_size) <= candidates:
        m += 1
    return m


def _largest_that_fit(cfg: BankBenchConfig, measurable: int) -> str:
    """``"candidates=C, root_budget=M (group_size G, continuations_per_root N)"``: the largest
    sizes a bank with ``measurable`` prompts per step holds."""
    m = largest_root_budget(measurable, cfg.group_size, cfg.continuations_per_root)
    return (f"candidates={measurable}, root_budget={m} (group_size {cfg.group_size}, continuations_per_root "
            f"{cfg.continuations_per_root})")


def bank_sizes(cfg: BankBenchConfig, n_prompts: int, n_held_out: int) -> tuple[int, int, str | None]:
    """``(candidates, root_budget, note)`` of a bench on a bank of ``n_prompts`` prompts,
    ``n_held_out`` of them the warm-up slice: each size the user gave, else the default
    (:data:`DEFAULT_CANDIDATES`, :data:`DEFAULT_ROOT_BUDGET`) lowered to what the bank holds
    (every measurable prompt; the largest M whose fixed groups fit them); ``note`` is one line
    saying so when a default was lowered (else ``None``).

    Raises:
        ValueError: a given ``candidates`` over the measurable prompts, or no prompt left (one
            line naming the largest sizes that fit).
    """
    measurable = n_prompts - n_held_out
    where = f"{cfg.bank} has {n_prompts} prompts, warmup_prompts={n_held_out} of them held out"
    if measurable < 1:
        raise ValueError(f"{where}: none is left to measure; lower warmup_prompts")
    if cfg.candidates is not None and cfg.candidates > measurable:
        raise ValueError(f"candidates {cfg.candidates} exceed the {measurable} prompts left: {where}; the largest "
                         f"that fit: {_largest_that_fit(cfg, measurable)}, or leave both unset to size the bench "
                         "to the bank")
    candidates = cfg.candidates if cfg.candidates is not None else min(DEFAULT_CANDIDATES, measurable)
    root_budget = cfg.root_budget if cfg.root_budget is not None else max(2, min(
        DEFAULT_ROOT_BUDGET, largest_root_budget(candidates, cfg.group_size, cfg.continuations_per_root)))
    lowered = [f"{key}={value}" for key, value, default, given in (
        ("candidates", candidates, DEFAULT_CANDIDATES, cfg.candidates), ("root_budget", root_budget,
                                                                         DEFAULT_ROOT_BUDGET, cfg.root_budget))
        if given is None and value < default]
    note = (f"bench --bank: sized to the bank ({where}): {', '.join(lowered)} (set candidates= and root_budget= to "
            "choose)") if lowered else None
    return candidates, root_budget, note


def check_groups_fit(cfg: BankBenchConfig, strategies: Mapping[str, Strategy], measurable: int) -> None:
    """Every fixed-group strategy's root rollouts fit the candidates (checked before any step
    runs; the allocator itself would refuse in the middle of the bench).

    Raises:
        ValueError: one line naming the strategies, what they need, and the largest sizes that fit.
    """
    from trace_gym.allocation.allocators import GroupSized

    # a wave strategy has no root allocator of fixed groups: it plans its own waves within the budget
    need = {name: groups_needed(s.budget_split(cfg.nominal_budget)[0], s.root_allocator.group_size)
            for name, s in strategies.items()
            if isinstance(getattr(s, "root_allocator", None), GroupSized) and s.root_allocator.group_size >= 2}
    over = sorted(name for name, n in need.items() if n > cfg.candidates)
    if over:
        fits = largest_root_budget(cfg.candidates, cfg.group_size, cfg.continuations_per_root)
        raise ValueError(f"root_budget {cfg.root_budget} (nominal budget {cfg.nominal_budget:g}) needs up to "
                         f"{max(need[n] for n in over)} groups of {cfg.group_size} per step for {', '.join(over)}, "
                         f"more than candidates={cfg.candidates}: "
                         + (f"root_budget={fits} fits these candidates; " if fits >= 2 else "")
                         + f"the largest that fit the bank: {_largest_that_fit(cfg, measurable)}")


def warmup_size(cfg: BankBenchConfig, n_prompts: int) -> int:
    """The warm-up slice's size: ``cfg.warmup_prompts``, or by default
    min(:data:`DEFAULT_WARMUP_PROMPTS`, a quarter of the bank's ``n_prompts``)."""
    if cfg.warmup_prompts is not None:
        return cfg.warmup_prompts
    return min(DEFAULT_WARMUP_PROMPTS, n_prompts // 4)


def bank_truth(records: Sequence[Any], mixed_rule: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """The predictor-quality truth of bank candidates: each prompt's empirical success rate over
    its recorded roots, and whether those roots were mixed (1.0) or pure (0.0) by ``mixed_rule``
    (:mod:`trace_gym.step.mixed`; default the success line)."""
    from trace_gym.step.mixed import THRESHOLD

    rule = mixed_rule or THRESHOLD
    rates = np.array([r.prompt_rate() for r in records], dtype=float)
    mixed = np.array([float(rule.group(root["reward"] for root in r.roots if root["turns"])) for r in records])
    return rates, mixed


def policy_folder(manifest: Mapping[str, Any]) -> str:
    """The recorded policy's folder here (what an ``lm_critic`` reads): the manifest's path if it
    exists, else its name resolved (a known model is pulled).

    Raises:
        ValueError: neither works, naming the policy and why.
    """
    from trace_gym.models import resolve_model

    if manifest.get("policy_path") and Path(manifest["policy_path"]).is_dir():
        return str(manifest["policy_path"])
    name = manifest.get("policy")
    if not name:
        raise ValueError("the bank's manifest names no policy, so an lm_critic has no model to read")
    try:
        return str(resolve_model(name))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise ValueError(f"the bank's policy {name!r} cannot be found here ({exc}); an lm_critic needs it") from None
