"""What a bank says about its policy and env (``trace-gym bank stats``), in one streaming pass.

- the distribution of prompt success rates (over each prompt's R roots), and the
  probability that a group of G roots drawn without replacement is mixed
  (:func:`mixed_without_replacement`): exactly what uniform (GRPO) gets when it replays
  this bank at group size G;
- the probability that one continuation from depth t flips the observed outcome of its
  root (by t; depth 0: that a second root differs from the first), which is
  2 E[V_t (1 - V_t)] for the value martingale V_t, and so says how much each turn reveals;
- optionally, the Spearman of a learned predictor against the bank's empirical rates,
  trained online over the bank (each batch scored before it is trained on), at prompt
  level and per prefix depth (:func:`predictor_spearman`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.banks.format import BankPrompt, iter_prompts, read_header
from trace_gym.banks.replay import BankTree, append_episode
from trace_gym.predictor.kinds import Context
from trace_gym.agent.rollout import node_context
from trace_gym.step.learning import PREFIX_SHARE, prefix_weight_for_share
from trace_gym.tree import ROOT

#: Bin edges of the success-rate histogram (the first and last bins are exactly 0 and 1).
RATE_BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Largest group size G of ``mixed_by_group_size`` (GRPO groups are 2-64).
MAX_GROUP = 64


def mixed_without_replacement(successes: int, recorded: int, group: int) -> float:
    """P(a group of ``group`` draws without replacement from ``recorded`` roots, ``successes`` of
    them successes, holds both outcomes) = 1 - C(s, G) / C(R, G) - C(R - s, G) / C(R, G).

    >>> mixed_without_replacement(2, 4, 2)  # 1 - 1/6 - 1/6
    0.6666666666666667
    """
    if not 0 <= successes <= recorded or not 1 <= group <= recorded:
        raise ValueError(f"need 0 <= successes <= recorded and 1 <= group <= recorded, got "
                         f"{successes}, {recorded}, {group}")
    total = math.comb(recorded, group)
    return 1.0 - (math.comb(successes, group) + math.comb(recorded - successes, group)) / total


def _histogram(rates: Sequence[float]) -> dict[str, int]:
    out = {"0": sum(r == 0 for r in rates)}
    for lo, hi in zip(RATE_BINS[:-1], RATE_BINS[1:]):
        out[f"({lo:g}, {hi:g}{']' if hi < 1 else ')'}"] = sum(lo < r <= hi if hi < 1 else lo < r < hi for r in rates)
    out["1"] = sum(r == 1 for r in rates)
    return out


def task_kind(task_id: Any) -> str:
    """The kind of task an id names: the part before its last ``/`` (``gen/d1/s0/17`` -> ``gen/d1/s0``, a
    tier of the generated math family; ``synthetic/director/5`` -> ``synthetic/director``); ``""`` for an
    id without one. Kinds are what a text predictor can tell from the prompt's form alone, which the
    calibrated simulator's task types copy (:mod:`trace_gym.sim.prior`)."""
    text = "" if task_id is None else str(task_id)
    return text.rsplit("/", 1)[0] if "/" in text else ""


@dataclass
class _Tally:
    """Running counts of :func:`bank_stats`'s one pass over a bank."""

    rates: list[float] = field(default_factory=list)  # per prompt with a leaf
    counts: list[tuple[int, int]] = field(default_factory=list)  # per prompt: (successes, roots with a leaf)
    kinds: list[str] = field(default_factory=list)  # per prompt of ``counts``: its task kind (task_kind)
    flips: dict[int, list[int]] = field(default_factory=dict)  # depth -> [flips, continuations]
    kind_flips: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # kind -> depth -> [flips, conts]
    turns: list[int] = field(default_factory=list)  # turns of each root that has any
    ends: dict[str, int] = field(default_factory=dict)  # episode end -> episodes
    prompt_tokens: list[int] = field(default_factory=list)  # per prompt
    roots: int = 0
    prefixes: int = 0
    continuations: int = 0
    left_out: int = 0  # prefixes left out
    errors: int = 0  # episodes with an error
    episodes: int = 0
    n_turns: int = 0  # over all episodes
    generated: int = 0  # policy tokens
    prefill: int = 0  # tokens
    env_steps: int = 0
    observation: int = 0  # tokens

    def add_prompt(self, record: BankPrompt) -> None:
        self.prompt_tokens.append(record.data.get("prompt_tokens", 0))
        outcomes = record.outcomes()
        if outcomes:
            self.rates.append(sum(outcomes) / len(outcomes))
            self.counts.append((sum(outcomes), len(outcomes)))
            self.kinds.append(task_kind(record.task_id))
        if len(outcomes) >= 2:  # depth 0: a second root against the first, over all ordered pairs
            s, n = sum(outcomes), len(outcomes)
            f = self.flips.setdefault(0, [0, 0])
            f[0] += 2 * s * (n - s)
            f[1] += n * (n - 1)
        by_depth = self.kind_flips.setdefault(task_kind(record.task_id), {})
        for root in record.roots:
            self.add_root(root, by_depth)

    def add_root(self, root: Mapping[str, Any], kind_flips: dict[int, list[int]] | None = None) -> None:
        """Count a root and its continuations (flips by depth also into ``kind_flips``: its kind's)."""
        self.roots += 1
        self.left_out += len(root["left_out"])
        for ep in [root] + [c for p in root["prefixes"] for c in p["continuations"]]:
            self.add_episode(ep)
        if root["turns"]:
            self.turns.append(len(root["turns"]))
        for p in root["prefixes"]:
            self.prefixes += 1
            for c in p["continuations"]:
                self.continuations += 1
                if c["turns"] and root["turns"]:  # depth t: a continuation against its own root
                    for tally in (self.flips, kind_flips if kind_flips is not None else {}):
                        f = tally.setdefault(p["depth"], [0, 0])
                        f[0] += c["success"] != root["success"]
                        f[1] += 1

    def add_episode(self, ep: Mapping[str, Any]) -> None:
        self.episodes += 1
        self.errors += ep["error"] is not None
        self.ends[ep["end"]] = self.ends.get(ep["end"], 0) + 1
        self.n_turns += len(ep["turns"])
        self.observation += sum(t["observation_tokens"] for t in ep["turns"])
        self.generated += sum(t["policy_tokens"] for t in ep["turns"])
        self.prefill += sum(t["prefill_tokens"] for t in ep["turns"])
        self.env_steps += sum(t["env_steps"] for t in ep["turns"]) + ep.get("replayed_env_steps", 0)

    def costs(self) -> dict[str, Any]:
        """Tokens and env steps in all, per episode and per turn."""
        gen, n_turns = self.generated, self.n_turns
        return {"episodes": self.episodes, "generated_tokens": gen, "prefill_tokens": self.prefill,
                "env_steps": self.env_steps, "generated_tokens_per_episode": gen / max(self.episodes, 1),
                "policy_tokens_per_turn": gen / max(n_turns, 1),
                "observation_tokens_per_turn": self.observation / max(n_turns, 1),
                "prompt_tokens": float(np.mean(self.prompt_tokens)) if self.prompt_tokens else math.nan}


def _success_rate(rates: Sequence[float]) -> dict[str, Any]:
    """Mean, histogram and the all-fail / all-success / mixed shares of prompt success rates."""
    return {"mean": float(np.mean(rates)) if rates else math.nan, "histogram": _histogram(rates),
            "all_fail": float(np.mean([r == 0 for r in rates])) if rates else math.nan,
            "all_success": float(np.mean([r == 1 for r in rates])) if rates else math.nan,
            "mixed": float(np.mean([0 < r < 1 for r in rates])) if rates else math.nan}


def _mixed_by_group_size(counts: Sequence[tuple[int, int]], roots_per_prompt: int) -> dict[str, float]:
    """``{G: mean P(mixed)}`` for G = 2 .. the most roots with a leaf any prompt has (at most
    ``roots_per_prompt`` and :data:`MAX_GROUP`), over the prompts with at least G roots with a
    leaf (a G no prompt reaches is left out). Each distinct (successes, roots) is computed once."""
    top = min(max((n for _, n in counts), default=0), int(roots_per_prompt), MAX_GROUP)
    mixed_by_g = {}
    for g in range(2, top + 1):
        memo: dict[tuple[int, int], float] = {}
        usable = [(s, n) for s, n in counts if n >= g]
        if usable:
            mixed_by_g[str(g)] = float(np.mean([memo[(s, n)] if (s, n) in memo else
                                                memo.setdefault((s, n), mixed_without_replacement(s, n, g))
                                                for s, n in usable]))
    return mixed_by_g


def _turns_summary(turns: Sequence[int]) -> dict[str, Any]:
    """Mean, min, max and histogram of the roots' turn counts."""
    return {"mean": float(np.mean(turns)) if turns else math.nan, "min": min(turns, default=0),
            "max": max(turns, default=0), "histogram": {str(t): turns.count(t) for t in sorted(set(turns))}}


def bank_stats(path: str | os.PathLike, *, predictor: Any = None, predictor_prompts: int | None = 512,
               batch_prompts: int = 16, verify: bool = True) -> dict[str, Any]:
    """Calibration numbers of a bank (one streaming pass; see the module docstring).

    Args:
        path: the bank file.
        predictor: a fresh text predictor (``make_predictor(...)``) to measure, or ``None``.
        predictor_prompts: prompts the predictor pass reads (``None``: all).
        batch_prompts: prompts per predictor update.
        verify: check the checksum (``BankError`` at the end of the pass on a mismatch).

    Returns:
        ``{"path", "manifest", "prompts", "roots", "prefixes", "continuations", "left_out_prefixes",
        "errors", "success_rate": {"mean", "histogram", "all_fail", "all_success", "mixed"},
        "prompt_counts": [[successes, roots with a leaf] per prompt], "prompt_kinds": [each one's
        :func:`task_kind`],
        "mixed_by_group_size": {G: P(mixed)}, "flip_by_depth": {t: {"flip", "continuations"}},
        "flip_counts_by_kind": {kind: {t: [flips, continuations]}} (prefix depths t >= 1),
        "turns": {"mean", "min", "max", "histogram"}, "costs": {... per episode and per turn}, "ends": {end: count},
        "predictor"?}``.
    """
    header = read_header(path)
    manifest = header["manifest"]
    tally = _Tally()
    for record in iter_prompts(path, verify=verify):
        tally.add_prompt(record)
    out: dict[str, Any] = {
        "path": str(path), "manifest": manifest, "prompts": len(tally.rates), "roots": tally.roots,
        "prefixes": tally.prefixes, "continuations": tally.continuations, "left_out_prefixes": tally.left_out,
        "errors": tally.errors,
        "success_rate": _success_rate(tally.rates),
        "mixed_by_group_size": _mixed_by_group_size(tally.counts, int(manifest["roots"])),
        "prompt_counts": [[int(s), int(n)] for s, n in tally.counts],
        "prompt_kinds": list(tally.kinds),
        "flip_by_depth": {str(d): {"flip": f / n if n else math.nan, "continuations": n}
                          for d, (f, n) in sorted(tally.flips.items())},
        "flip_counts_by_kind": {kind: {str(d): [f, n] for d, (f, n) in sorted(by.items())}
                                for kind, by in sorted(tally.kind_flips.items()) if by},
        "turns": _turns_summary(tally.turns),
        "costs": tally.costs(),
        "ends": dict(sorted(tally.ends.items())),
    }
    if predictor is not None:
        out["predictor"] = predictor_spearman(path, predictor, prompts=predictor_prompts, batch_prompts=batch_prompts)
    return out


def prompt_samples(record: BankPrompt) -> tuple[list[Context], list[float], list[int]]:
    """A prompt's anchors with an empirical rate, as a live predictor reads them: the prompt (its
    roots' rate) and every recorded prefix with a continuation leaf (their rate), the history built
    from the replayed tree (:func:`trace_gym.agent.rollout.node_context`)."""
    contexts, rates, depths = [Context(record.prompt)], [record.prompt_rate()], [0]
    for j, root in enumerate(record.roots):
        tree = BankTree(record.task_id, text=record.prompt)
        leaf = append_episode(tree, ROOT, root, {"root": j}, [p["depth"] for p in root["prefixes"]])
        if leaf is None:
            continue
        for node_id in tree.path(leaf)[1:-1]:
            rate = record.prefix_rate(j, tree.nodes[node_id].depth)
            if rate is not None:
                contexts.append(node_context(tree, node_id, record.prompt))
                rates.append(rate)
                depths.append(tree.nodes[node_id].depth)
    return contexts, rates, depths


def predictor_spearman(path: str | os.PathLike, predictor: Any, *, prompts: int | None = 512,
                       batch_prompts: int = 16, prefix_share: float = PREFIX_SHARE) -> dict[str, Any]:
    """A learned predictor's rank correlation with the bank's empirical rates, trained online.

    The bank is read in batches of ``batch_prompts`` prompts; each batch is scored first
    and then trained on (prefix samples weighted to ``prefix_share`` of the batch, as in
    the step driver), so every score is out-of-sample.

    Returns:
        ``{"prompt": rho, "prefix": rho, "by_depth": {t: rho}, "prompts": n, "prefixes": n}``.
    """
    from trace_gym import report

    pred, truth, depth = [], [], []
    batch: list[tuple[list[Context], list[float], list[int]]] = []

    def flush() -> None:
        contexts = [c for b in batch for c in b[0]]
        rates = [r for b in batch for r in b[1]]
        depths = np.array([d for b in batch for d in b[2]])
        pred.extend(np.asarray(predictor.predict(contexts), dtype=float).tolist())
        truth.extend(rates)
        depth.extend(depths.tolist())
        w = prefix_weight_for_share(int((depths == 0).sum()), int((depths > 0).sum()), prefix_share)
        predictor.update(contexts, rates, np.where(depths > 0, w, 1.0))
        batch.clear()

    for n, record in enumerate(iter_prompts(path, verify=False)):
        if prompts is not None and n >= prompts:
            break
        batch.append(prompt_samples(record))
        if len(batch) == batch_prompts:
            flush()
    if batch:
        flush()
    p, t, d = np.array(pred), np.array(truth), np.array(depth, dtype=int)
    by_depth = report.spearman_by_depth(p, t, d) if len(d) else {}
    return {"prompt": by_depth.get(0, math.nan), "prefix": report.spearman(p[d > 0], t[d > 0]),
            "by_depth": {str(k): v for k, v in by_depth.items() if k > 0},
            "prompts": int((d == 0).sum()), "prefixes": int((d > 0).sum())}


def format_bank_stats(stats: Mapping[str, Any]) -> str:
    """The printed form of :func:`bank_stats` (markdown)."""
    from trace_gym.report import markdown_table

    m, sr = stats["manifest"], stats["success_rate"]
    lines = [f"## Rollout bank {stats['path']}", "",
             f"{m.get('env_id')} with {m.get('policy') or '?'} (weights {str(m.get('weights_sha256'))[:12]}); "
             f"{stats['prompts']} prompts x R = {m['roots']} roots, K = {m['continuations']} continuations per "
             f"recorded prefix (cap {m.get('max_prefixes_per_root') or 'none'}): {stats['prefixes']} prefixes, "
             f"{stats['continuations']} continuations, {stats['left_out_prefixes']} prefixes left out, "
             f"{stats['errors']} episodes ended on an error.", "",
             "### Prompt success rates", "",
             f"mean {sr['mean']:.3f}; all fail {100 * sr['all_fail']:.1f} %, all succeed {100 * sr['all_success']:.1f} "
             f"%, mixed {100 * sr['mixed']:.1f} %", "",
             markdown_table(list(sr["histogram"]), [list(sr["histogram"].values())]), ""]
    if stats["mixed_by_group_size"]:
        lines += ["P(a uniform group of G drawn from the bank is mixed):", "",
                  markdown_table(["G", *stats["mixed_by_group_size"]],
                                 [["P(mixed)", *stats["mixed_by_group_size"].values()]]),
                  ""]
    flips = stats["flip_by_depth"]
    lines += ["### P(one continuation from depth t flips the observed outcome)", "",
              "(depth 0: a second root rollout differs from the first)", "",
              markdown_table(["depth", *flips], [["flip", *[v["flip"] for v in flips.values()]],
                                                 ["n", *[v["continuations"] for v in flips.values()]]]), ""]
    c = stats["costs"]
    lines += [f"Turns per root: mean {stats['turns']['mean']:.2f}, min {stats['turns']['min']}, "
              f"max {stats['turns']['max']}. "
              f"{c['episodes']} episodes: {c['generated_tokens']:,} generated tokens "
              f"({c['generated_tokens_per_episode']:.0f} per episode), {c['prefill_tokens']:,} prefill tokens, "
              f"{c['env_steps']:,} env steps. Endings: " + ", ".join(f"{k} {v}" for k, v in stats["ends"].items())]
    p = stats.get("predictor")
    if p:
        lines += ["", f"### Learned predictor against the bank's empirical rates (online, out-of-sample; "
                      f"{p['prompts']} prompts, {p['prefixes']} prefixes)", "",
                  f"Spearman prompt {p['prompt']:.3f}, prefix {p['prefix']:.3f}; by depth: "
                  + (", ".join(f"{d}: {r:.3f}" for d, r in p["by_depth"].items()) or "none")]
    return "\n".join(lines)
