"""Two or more bench results (``bench --json``), paired after the fact.

Arms of different bench runs can be paired when the runs drew the same repetitions: the
same source (the same bank, by checksum), seeds, steps and candidate pools. Then every
arm's per-repetition rows line up with every other's (common random numbers), and the
paired table, the ranking (:mod:`trace_gym.bench.rank`) and the checks are computed over
the union of the arms as if one bench had run them all. ``trace-gym compare A.json B.json``
calls :func:`pair_bench_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

#: Config keys that decide a bench's repetitions (what it drew); they must agree to pair.
SAME_DRAWS = ("seed", "seeds", "steps", "warmup_steps", "candidates", "warmup_prompts", "epochs", "pool_size")


def is_bench_json(path: str | Path) -> bool:
    """A file that ``bench --json`` wrote (by its name and first bytes; not parsed)."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return False
    with open(p, "rb") as f:
        head = f.read(4096)
    return b'"mode"' in head and (b'"strategies"' in head or b'"config"' in head)


def _load(path: str | Path) -> dict[str, Any]:
    from trace_gym.runs.files import read_json_file

    try:
        data = read_json_file(path, max_bytes=256 << 20)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable bench result ({exc})") from None
    if type(data) is not dict or type(data.get("strategies")) is not dict or type(data.get("config")) is not dict:
        raise ValueError(f"{path}: not a bench result (bench --json writes one): needs 'config' and 'strategies'")
    for name, row in data["strategies"].items():
        if type(row) is not dict or type(row.get("per_rep")) is not list:
            raise ValueError(f"{path}: strategy {name!r:.80} has no per-repetition rows")
    return data


def _draws(data: Mapping[str, Any]) -> dict[str, Any]:
    cfg = data["config"]
    out = {"mode": data.get("mode"), **{k: cfg.get(k) for k in SAME_DRAWS}}
    if isinstance(data.get("bank"), Mapping):
        out["bank"] = data["bank"].get("sha256")
    return out


def merge_benches(results: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """One bench result holding every arm of ``results`` (their draws must agree). An arm name
    that two results share is prefixed with its result's label (``label/name``).

    Raises:
        ValueError: the results drew different repetitions (naming the key and the values).
    """
    first = _draws(results[0])
    for label, data in zip(labels[1:], results[1:]):
        for key, value in _draws(data).items():
            if value != first[key]:
                raise ValueError(f"cannot pair {labels[0]} with {label}: they drew different repetitions ({key} "
                                 f"{first[key]!r} vs {value!r}); rerun one with the other's {key}")
    seen: dict[str, int] = {}
    for data in results:
        for name in data["strategies"]:
            seen[name] = seen.get(name, 0) + 1
    merged = dict(results[0])
    merged["strategies"], merged["violations"], merged["warnings"] = {}, {}, []
    for label, data in zip(labels, results):
        for name, row in data["strategies"].items():
            merged["strategies"][name if seen[name] == 1 else f"{label}/{name}"] = row
        merged["violations"].update({f"{label}/{k}": v for k, v in (data.get("violations") or {}).items()})
        merged["warnings"] += list(data.get("warnings") or [])
    counts = {len(r["per_rep"]) for r in merged["strategies"].values()}
    if len(counts) > 1:
        raise ValueError(f"the arms have different numbers of repetitions ({sorted(counts)}); pair runs of equal seeds")
    merged["paired_from"] = list(labels)
    merged["seconds"] = sum(float(d.get("seconds") or 0.0) for d in results)
    return merged


def pair_bench_files(paths: Sequence[str | Path], names: Sequence[str] | None = None, *,
                     baseline: str = "uniform", method: str = "trace") -> dict[str, Any]:
    """The union of several ``bench --json`` results, judged: paired table, checks, verdict and
    ranking over every arm (:func:`trace_gym.bench.loop.judge`)."""
    from trace_gym.bench.loop import judge
    from trace_gym.bench.checks import Roles

    if len(paths) < 2:
        raise ValueError("pairing bench results needs at least two files")
    labels = list(names) if names else [Path(p).stem for p in paths]
    if len(labels) != len(paths) or len(set(labels)) != len(labels):
        raise ValueError(f"--names needs {len(paths)} distinct labels, got {labels}")
    merged = merge_benches([_load(p) for p in paths], labels)
    return judge(merged, Roles(baseline=baseline, method=method))


def format_paired(results: Mapping[str, Any]) -> str:
    """The paired view of merged results: verdict, paired differences and ranking."""
    from trace_gym.bench.rank import ranking_section
    from trace_gym.bench.report import paired_section

    lines = [f"## Bench results paired after the fact: {', '.join(results['paired_from'])}", "",
             f"**Verdict:** {results['verdict']}", ""]
    for name, why in (results.get("violations") or {}).items():
        lines += [f"**NO VERDICT for {name}:** {why}", ""]
    lines += paired_section(results) + [""] + ranking_section(results)
    lines += ["### Checks", ""] + [c.line() for c in results["checks"]]
    return "\n".join(lines)
