"""One frozen dataclass config per entry point, loaded from YAML, flags or ``key=value``.

Every field is declared once, with its type, default and a help string
(``field(default=..., metadata=doc("..."))``); everything else is derived from that
declaration:

- :func:`config_from_mapping` builds a config from a dict (a YAML file), coercing each
  value to the field's real type (lists become tuples, ints become floats) and naming
  the key and the expected type when a value does not fit;
- :func:`parse_field_text` parses one command-line string for a field (``"a,b"`` for a
  tuple, ``true/false`` for a bool);
- :func:`load_config`, the one loader, stacks a YAML file and ``key=value`` overrides
  (dotted keys reach into nested sections such as ``trainer``);
- :func:`config_help` lists the fields (sections included) for ``--help`` texts;
- :func:`did_you_mean` is the one "did you mean X?" hint of every unknown-name error.

argparse itself lives in ``trace_gym/cli.py`` alone; it asks this module what flags a
config has and how to parse them.

The bench configs live here (:class:`SimBenchConfig`, :class:`EnvBenchConfig`); the
trainer's and evaluator's configs sit beside them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypeVar

from trace_gym.predictor import check_predictor_name, predictor_names

C = TypeVar("C")


def doc(text: str) -> dict[str, str]:
    """Field metadata holding the field's help text."""
    return {"help": text}


# ---------------------------------------------------------------------- field types
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> its resolved type (annotations are strings under ``from __future__``)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def type_name(tp: Any) -> str:
    """A short readable name for a field type (``int``, ``tuple[str, ...]``, ``str | None``)."""
    origin = typing.get_origin(tp)
    if origin is None:
        return getattr(tp, "__name__", str(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    args = typing.get_args(tp)
    inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
    return f"{origin.__name__}[{inner}]"


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a bool (true/false), got {value!r}")


def coerce(tp: Any, value: Any) -> Any:
    """``value`` (from YAML, JSON or a parsed flag) as type ``tp``; ValueError when it does not fit.

    Strings are parsed (``"3"`` for an int, ``"a,b"`` for a tuple); lists become tuples;
    an int is accepted for a float; nothing else is converted silently.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and type(None) in options):
            if type(None) in options:
                return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(option, value)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(f"expected {type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"expected one of {list(allowed)}, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        item = args[0] if args else Any
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list for {type_name(tp)}, got {value!r}")
        return tuple(value if item is Any else (coerce(item, v) for v in value))
    if origin is dict or tp is dict:
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"expected a JSON object, got {value!r} ({exc.msg})") from None
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        return _bool(value)
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"expected an int, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ValueError(f"expected an int, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ValueError(f"expected a number, got {value!r}")
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):  # a nested section (e.g. ``trainer``)
        if dataclasses.is_dataclass(value) and isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping of {tp.__name__} keys, got {value!r}")
        return config_from_mapping(tp, value, source=tp.__name__)
    raise TypeError(f"config fields of type {type_name(tp)} are not supported")


def parse_field_text(cls: type, name: str, text: str) -> Any:
    """Parse one command-line string for field ``name`` of ``cls``."""
    tp = field_types(cls)[name]
    try:
        return coerce(tp, text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


# ---------------------------------------------------------------------- building configs
def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean X?"`` for the closest of ``known`` (difflib), else ``""``."""
    import difflib

    near = difflib.get_close_matches(name, list(known), n=3)
    return f"; did you mean {', '.join(near)}?" if near else ""


def _key_names(cls: type) -> list[str]:
    """Every key of ``cls``: its fields and ``section.field`` for its sections."""
    subs = sections(cls)
    return sorted(field_types(cls)) + [f"{n}.{f}" for n, c in subs.items() for f in field_types(c)]


def _unknown_keys(source: str, cls: type, unknown: Sequence[str]) -> ValueError:
    """The one error for keys ``cls`` does not have, each with its closest known key."""
    names = _key_names(cls)
    hints = [(key, did_you_mean(key, names)) for key in unknown]
    if len(hints) == 1 and hints[0][1]:
        hint = hints[0][1]
    elif any(h for _, h in hints):
        hint = "".join(f"; {key!r}: {h.removeprefix('; ')}" for key, h in hints if h)
    else:
        hint = f"; known: {sorted(field_types(cls))}"
    return ValueError(f"{source}: unknown key(s) {list(unknown)} for {cls.__name__}{hint}")


def _check_mapping(cls: type, data: Mapping[str, Any], *, source: str, prefix: str = "") -> None:
    """Raise ``ValueError`` naming ``source`` for the first unknown key (with the closest
    known ones) or ill-typed value of ``data``, nested sections included; builds nothing,
    so checks that need every key (``__post_init__``) are left to the config itself."""
    types_, subs = field_types(cls), sections(cls)
    unknown = [key for key in data if key not in types_]
    if unknown:
        raise _unknown_keys(f"{source} ({prefix.rstrip('.')})" if prefix else source, cls, unknown)
    for key, value in data.items():
        if key in subs and isinstance(value, Mapping):
            _check_mapping(subs[key], value, source=source, prefix=f"{prefix}{key}.")
            continue
        try:
            coerce(types_[key], value)
        except ValueError as exc:
            raise ValueError(f"{source}: {prefix}{key}: {exc}") from None


def config_from_mapping(cls: type[C], data: Mapping[str, Any], *, source: str = "config",
                        blame: Mapping[str, str] | None = None) -> C:
    """Build ``cls`` from ``data``, rejecting unknown keys and ill-typed values by name.

    Args:
        cls: a dataclass config type.
        data: field name -> value (YAML values, or strings from the command line).
        source: where ``data`` came from, for error messages (a file name).
        blame: where single keys came from, when not from ``source`` (key -> ``"command line"``).
    """
    blame = dict(blame or {})
    types_ = field_types(cls)
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise _unknown_keys(source, cls, unknown)
    values = {}
    for key, value in data.items():
        try:
            values[key] = coerce(types_[key], value)
        except ValueError as exc:
            raise ValueError(f"{blame.get(key, source)}: {key}: {exc}") from None
    return cls(**values)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file holding one mapping (empty file: empty mapping)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
    loaded = loaded or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {str(p)!r} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """``["key=value", ...]`` -> ``{key: value}`` (values stay strings; typed later)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not of the form key=value")
        out[key.strip().replace("-", "_")] = value
    return out


def sections(cls: type) -> dict[str, type]:
    """Field name -> config class, for the fields of ``cls`` that are nested sections."""
    return {name: tp for name, tp in field_types(cls).items() if dataclasses.is_dataclass(tp)}


def nest(cls: type, flat: Mapping[str, Any], *, source: str = "config") -> dict[str, Any]:
    """``{"steps": 3, "trainer.lr": 1e-5}`` -> ``{"steps": 3, "trainer": {"lr": 1e-5}}`` for the
    sections of ``cls``; an unknown key (or an unknown section) raises ``ValueError`` naming
    ``source``, with the closest known keys."""
    known, subs = set(field_types(cls)), sections(cls)
    out: dict[str, Any] = {}
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if dot and head in subs:
            inner = nest(subs[head], {rest: value}, source=f"{source} ({head})")
            out.setdefault(head, {}).update(inner)
            continue
        if key not in known:
            raise _unknown_keys(source, cls, [key])
        out[key] = value
    return out


def load_config(cls: type[C], path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> C:
    """The one config loader: a YAML file (if any), then ``key=value`` overrides on top.

    Nested sections (a field whose type is itself a config, e.g. ``trainer``) are YAML
    mappings; an override reaches into one with a dotted key (``trainer.lr=1e-5``).
    Unknown keys and ill-typed values raise ``ValueError`` naming them and where they
    came from (the file for its keys, ``command line`` for the overrides), with the
    closest known key, before anything loads.
    """
    source = str(path) if path else "config"
    data: dict[str, Any] = read_yaml(path) if path else {}
    _check_mapping(cls, data, source=source)
    line = nest(cls, dict(overrides or {}), source="command line")
    _check_mapping(cls, line, source="command line")
    blame: dict[str, str] = {}
    for key, value in line.items():
        if key in sections(cls) and isinstance(value, Mapping):
            section = data.get(key) or {}
            if not isinstance(section, Mapping):
                raise ValueError(f"{source}: {key} must be a mapping of {sections(cls)[key].__name__} keys, "
                                 f"got {section!r}")
            data[key] = {**section, **value}
            blame[key] = f"{source} and the command line" if section else "command line"
        else:
            data[key] = value
            blame[key] = "command line"
    return config_from_mapping(cls, data, source=source, blame=blame)


def flatten(cls: type, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`nest` for a resolved config's mapping (``trainer.lr`` keys)."""
    subs = sections(cls)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key in subs and isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in flatten(subs[key], value).items()})
        else:
            out[key] = value
    return out


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML (tuples written as lists), for a run directory."""
    import yaml

    def plain(v: Any) -> Any:
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return yaml.safe_dump({k: plain(v) for k, v in dataclasses.asdict(cfg).items()}, sort_keys=False)


def config_help(cls: type, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """``(name, type name, default, help)`` for every field of ``cls``; a nested section
    lists its own fields as ``section.name`` instead of itself."""
    types_ = field_types(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(types_[f.name]):
            out += config_help(types_[f.name], prefix=f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out.append((prefix + f.name, type_name(types_[f.name]), default, f.metadata.get("help", "")))
    return out


# ---------------------------------------------------------------------- the bench configs
def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)!r}")


BUDGET_UNITS = ("nominal", "tokens")


@dataclass(frozen=True)
class SimBenchConfig:
    """``trace-gym bench --sim``: strategies on simulated tasks with a known success martingale.

    The default is paper-like: a GRPO baseline with groups of 8 that are mixed about
    27 % of the time (DeepScaleR with Qwen3-8B), the (M, N) = (M, 2) tree shape the
    paper found best, and a candidate pool as large as the root budget so the root
    stage can skip most prompts (the paper skipped 65-71 %). Every predictor-driven
    strategy uses the *learned* predictor; the oracle runs once more, labelled as an
    upper bound.
    """

    seeds: int = field(default=3, metadata=doc("independent seeds (a fresh task pool each)"))
    steps: int = field(default=5, metadata=doc("allocation steps per seed (a fresh candidate pool each)"))
    warmup_steps: int = field(default=1, metadata=doc("first steps run (the predictor trains) but not measured"))
    pool_size: int = field(default=4096, metadata=doc("simulated tasks in the dataset"))
    candidates: int = field(default=256, metadata=doc("candidate prompts scored per step"))
    root_budget: int = field(default=256, metadata=doc("M: root rollouts of a tree strategy per step"))
    continuations_per_root: int = field(default=2, metadata=doc("N: continuations per root; nominal budget = M (1 + N/2)"))
    group_size: int = field(default=8, metadata=doc("G: group size of every fixed-group strategy (uniform, pcl)"))
    predictor: str = field(default="learned", metadata=doc(
        "predictor of every predictor-driven strategy: " + " | ".join(predictor_names("sim"))))
    noisy_spearman: float = field(default=0.8, metadata=doc("prompt-level Spearman of the noisy oracle"))
    feature_spearman: float = field(default=0.8, metadata=doc(
        "prompt-level Spearman between the task feature a learned predictor sees and the true success (a "
        "modelling assumption; see docs/strategies.md)"))
    prefix_share: float = field(default=0.06, metadata=doc(
        "share of the learned predictor's batch weight on prefix samples (the paper: about 6 %)"))
    oracle_upper_bound: bool = field(default=True, metadata=doc(
        "also run TRACE with the oracle predictor, labelled as an upper bound"))
    budget_unit: str = field(default="nominal", metadata=doc(
        "what is equalised across strategies: nominal (M (1 + N/2)) | tokens (exact generated tokens)"))
    strategies: tuple[str, ...] = field(default=(), metadata=doc("comma-separated strategy names (default: all)"))
    plugins: tuple[str, ...] = field(default=(), metadata=doc(
        "modules to import first (not installed plugins: their envs and strategies register on import)"))
    target_mixed: float = field(default=0.27, metadata=doc("P(uniform group of G is mixed) to calibrate to"))
    mean_success: float = field(default=0.5, metadata=doc("mean task success probability"))
    step_concentration: float = field(default=3.0, metadata=doc("kappa of the per-turn beta-splitting martingale"))
    min_turns: int = field(default=3, metadata=doc("shortest simulated episode (turns)"))
    max_turns: int = field(default=6, metadata=doc("longest simulated episode (turns)"))
    calibrate_from: str = field(default="", metadata=doc(
        "a rollout bank: set mean_success, target_mixed, step_concentration, min/max_turns and feature_spearman "
        "from its measurements (trace_gym/calibrate.py), and print them"))
    demo_values: tuple[float, ...] = field(
        default=(0.99, 0.9, 0.5, 0.5, 0.15, 0.02), metadata=doc("predicted values of the root-allocation demo"))
    demo_budgets: tuple[int, ...] = field(
        default=(2, 4, 8, 12, 16, 24, 32, 48, 64), metadata=doc("root budgets of the root-allocation demo"))

    def __post_init__(self) -> None:
        _positive(self, "seeds", "steps", "pool_size", "candidates", "group_size")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must lie in [0, steps={self.steps}), got {self.warmup_steps!r}")
        if self.candidates > self.pool_size:
            raise ValueError(f"candidates {self.candidates} exceed pool_size {self.pool_size}")
        if self.root_budget < 2 or self.continuations_per_root < 0:
            raise ValueError(f"need root_budget >= 2 and continuations_per_root >= 0, got "
                             f"{self.root_budget!r}, {self.continuations_per_root!r}")
        check_predictor_name(self.predictor, "sim")
        for name in ("noisy_spearman", "feature_spearman"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)!r}")
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"prefix_share must lie in [0, 1), got {self.prefix_share!r}")
        if self.budget_unit not in BUDGET_UNITS:
            raise ValueError(f"budget_unit must be one of {list(BUDGET_UNITS)}, got {self.budget_unit!r}")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError(f"need 1 <= min_turns <= max_turns, got {self.min_turns!r}, {self.max_turns!r}")

    @property
    def nominal_budget(self) -> float:
        from trace_gym.budget import nominal_cost

        return nominal_cost(self.root_budget, self.continuations_per_root)


@dataclass(frozen=True)
class EnvBenchConfig:
    """``trace-gym bench --env ENV``: strategies on real rollouts of a real policy (no training).

    The default is sized for the 2-core CPU machine: SmolLM2-135M on generated math
    tasks, 24 candidates, M = 8 roots with N = 2 continuations each (nominal 16).
    """

    env: str = field(default="math_python", metadata=doc("env family short name or registered env id"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc("JSON object of keyword arguments for the env"))
    task_kwargs: dict = field(default_factory=dict, metadata=doc("JSON object of keyword arguments for the task loader"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, local HF folder, hub id or RUN[@STEP]"))
    engine: str = field(default="auto", metadata=doc("rollout engine: auto | hf | vllm"))
    seeds: int = field(default=1, metadata=doc("independent repetitions (fresh pools each)"))
    candidates: int = field(default=24, metadata=doc("candidate prompts per repetition"))
    root_budget: int = field(default=8, metadata=doc("M: root rollouts of a tree strategy"))
    continuations_per_root: int = field(default=2, metadata=doc("N: continuations per root; budget M (1 + N/2)"))
    group_size: int = field(default=4, metadata=doc("G: group size of every fixed-group strategy (uniform, pcl)"))
    warmup_budget: int = field(default=16, metadata=doc("rollouts of the predictor warm-up batch (0: none)"))
    strategies: tuple[str, ...] = field(default=(), metadata=doc("comma-separated strategy names (default all)"))
    plugins: tuple[str, ...] = field(default=(), metadata=doc(
        "modules to import first (not installed plugins: their envs and strategies register on import)"))
    dump_episodes: int = field(default=0, metadata=doc(
        "write this many full transcripts per strategy (messages, actions, rewards) into --out"))
    max_turns: int = field(default=3, metadata=doc("turns per episode"))
    max_turn_tokens: int = field(default=160, metadata=doc("generated tokens per turn"))
    max_episode_tokens: int = field(default=1024, metadata=doc("context limit per episode, tokens"))
    temperature: float = field(default=1.0, metadata=doc("sampling temperature"))
    predictor: str = field(default="embedding", metadata=doc(
        "success predictor: " + " | ".join(predictor_names("text"))))
    predictor_kwargs: dict = field(default_factory=dict, metadata=doc(
        "JSON object of the predictor's keyword arguments, e.g. {\"device\": \"cuda\", \"dtype\": \"bfloat16\"}"))
    prefix_share: float = field(default=0.06, metadata=doc("share of the predictor's batch weight on prefix samples"))
    seed: int = field(default=0, metadata=doc("base seed (tasks, envs, sampling)"))

    def __post_init__(self) -> None:
        _positive(self, "seeds", "candidates", "group_size", "max_turns", "max_turn_tokens", "max_episode_tokens")
        if self.dump_episodes < 0:
            raise ValueError(f"dump_episodes must be >= 0, got {self.dump_episodes!r}")
        if self.root_budget < 2 or self.continuations_per_root < 0 or self.warmup_budget < 0:
            raise ValueError(f"need root_budget >= 2, continuations_per_root >= 0, warmup_budget >= 0; got "
                             f"{self.root_budget}, {self.continuations_per_root}, {self.warmup_budget}")
        check_predictor_name(self.predictor, "text")
        if not 0 <= self.prefix_share < 1:
            raise ValueError(f"prefix_share must lie in [0, 1), got {self.prefix_share!r}")

    @property
    def nominal_budget(self) -> float:
        from trace_gym.budget import nominal_cost

        return nominal_cost(self.root_budget, self.continuations_per_root)
