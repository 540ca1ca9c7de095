"""The modes of ``trace-gym bench``: one table, one entry per source of rollouts.

A mode is a :class:`BenchMode` declared by its source module (``MODE`` in
:mod:`trace_gym.bench.sim`, :mod:`trace_gym.bench.env`, :mod:`trace_gym.bench.bank`) and
named in :data:`BENCH_SOURCES` (lazily: the table costs nothing to import). Everything
that differs by mode reads the entry: the command's flag and keys
(:mod:`trace_gym.commands.bench`), the run, and the report's title and columns
(:mod:`trace_gym.bench.report`). A new mode is one module that declares its ``MODE``
and one line here (or :func:`register_bench_mode`)::

    register_bench_mode("mine", "my_pkg.bench_mine:MODE")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from trace_gym.utils.targets import load_target


@dataclass(frozen=True)
class BenchMode:
    """One mode of ``trace-gym bench``.

    Attributes:
        name: the mode (``bench --NAME``), the results' ``mode``.
        config: its config dataclass (the keys ``bench --NAME`` takes).
        run: ``run(cfg, strategies, *, progress, say, out_dir, **resources) -> results``.
        intro: ``intro(results) -> lines``: the report's title and description.
        help: the ``--NAME`` flag's help.
        value: the config field the flag's value sets (``--bank FILE`` sets ``bank``), or
            ``None`` for a switch (``--sim``).
        columns: the report's extra columns, ``(label, row key)`` pairs.
        requires: resources the face resolves for the run (``"family"``: the env family of
            ``cfg.env``), passed as keyword arguments.
        verdict_label: how the verdict line names the outcomes ("simulated", "real rollouts").
    """

    name: str
    config: type
    run: Callable[..., dict[str, Any]]
    intro: Callable[[Mapping[str, Any]], list[str]]
    help: str
    value: str | None = None
    columns: Sequence[tuple[str, str]] = ()
    requires: tuple[str, ...] = ()
    verdict_label: str = "real rollouts"
    metavar: str | None = None


#: Every mode of ``bench``: name -> ``"module:attribute"`` of its :class:`BenchMode`.
BENCH_SOURCES: dict[str, str] = {
    "sim": "trace_gym.bench.sim:MODE",
    "env": "trace_gym.bench.env:MODE",
    "bank": "trace_gym.bench.bank:MODE",
}


def register_bench_mode(name: str, target: str) -> None:
    """Add a mode (``target``: ``"module:attribute"`` of a :class:`BenchMode` named ``name``).

    Raises ``ValueError`` for a name taken by another target."""
    if BENCH_SOURCES.get(name, target) != target:
        raise ValueError(f"bench mode {name!r} is taken; known: {sorted(BENCH_SOURCES)}")
    BENCH_SOURCES[name] = target


def bench_mode(name: str) -> BenchMode:
    """The :class:`BenchMode` of ``name`` (imported on use).

    Raises:
        ValueError: an unknown mode, or a target that is not a BenchMode named ``name``.
    """
    if name not in BENCH_SOURCES:
        raise ValueError(f"unknown bench mode {name!r}; known: {', '.join(BENCH_SOURCES)}")
    mode = load_target(BENCH_SOURCES[name])
    if not isinstance(mode, BenchMode) or mode.name != name:
        raise ValueError(f"bench mode {name!r}: {BENCH_SOURCES[name]} is not a BenchMode named {name!r}")
    return mode


def bench_modes() -> dict[str, BenchMode]:
    """Every mode, in table order."""
    return {name: bench_mode(name) for name in BENCH_SOURCES}
