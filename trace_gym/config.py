"""One frozen dataclass config per entry point, loaded from YAML, flags or ``key=value``.

Every field is declared once, with its type, default and a help string, and a number
with its range (``field(default=..., metadata=doc("...", within="[1, 1000000]"))``: an
:class:`Interval`, whose finite bounds also declare the value finite; NaN lies in none);
everything else is derived from that declaration:

- :func:`config_from_mapping` builds a config from a dict (a YAML file), coercing each
  value to the field's real type (lists become tuples, ints become floats) and naming
  the key and the expected type when a value does not fit;
- :func:`parse_field_text` parses one command-line string for a field (``"a,b"`` for a
  tuple, ``true/false`` for a bool);
- :func:`load_config`, the one loader, stacks a YAML file and ``key=value`` overrides
  (dotted keys reach into nested sections such as ``trainer``);
- :func:`config_help` lists the fields (sections included) for ``--help`` texts;
- :func:`check_declared` holds a config built in Python to the same declarations;
- unknown keys get the closest known key (:func:`trace_gym.utils.suggest.did_you_mean`);
- a dict-valued field is parsed with the bounded JSON reader
  (:func:`trace_gym.utils.textsafe.loads_bounded`), and every YAML mapping key must be a string.

argparse itself lives in ``trace_gym/cli.py`` alone; it asks this module what flags a
config has and how to parse them.

This module is the loader machinery only and imports nothing of ``trace_gym`` but the leaves
:mod:`trace_gym.utils.config_fields` (what a field declares: :func:`doc`), :mod:`trace_gym.utils.suggest`
and :mod:`trace_gym.utils.textsafe`: each entry point's config lives beside it
(:data:`trace_gym.commands.ENTRY_CONFIGS` lists them), composed of the shared sections of
:mod:`trace_gym.config_sections`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from trace_gym.utils.config_fields import (  # noqa: F401  (doc, check_declared: the config API)
    MAX_CONFIG_DEPTH, Interval, check_declared, declared_problem, doc, nesting_depth_over, shown)
from trace_gym.utils.suggest import did_you_mean
from trace_gym.utils.textsafe import JSONRefused, loads_bounded

C = TypeVar("C")

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
    raise ValueError(f"expected a bool (true/false), got {shown(value)}")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an int, got {shown(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected an int, got {shown(value)}")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {shown(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise ValueError(f"expected a number, got {shown(value)}")


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {shown(value)}")
    return value


def _to_dict(value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = loads_bounded(value, max_depth=MAX_CONFIG_DEPTH)
        except JSONRefused as exc:
            raise ValueError(f"expected a JSON object, got text that {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {shown(value)}")
    if nesting_depth_over(value, MAX_CONFIG_DEPTH):
        raise ValueError(f"expected a mapping nested at most {MAX_CONFIG_DEPTH} levels deep, got a deeper one")
    bad = next((k for k in value if not isinstance(k, str)), None)
    if bad is not None:
        raise ValueError(f"expected a mapping with string keys, got the key {shown(bad)}")
    return dict(value)


def _to_union(tp: Any, value: Any) -> Any:
    options = typing.get_args(tp)
    if type(None) in options and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    for option in options:
        if option is type(None):
            continue
        try:
            return coerce(option, value)
        except ValueError:
            pass
    raise ValueError(f"expected {type_name(tp)}, got {shown(value)}")


def _to_tuple(tp: Any, value: Any) -> tuple:
    args = typing.get_args(tp)
    item = args[0] if args else Any
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list for {type_name(tp)}, got {shown(value)}")
    return tuple(value if item is Any else (coerce(item, v) for v in value))


def _to_section(tp: type, value: Any) -> Any:
    if dataclasses.is_dataclass(value) and isinstance(value, tp):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of {tp.__name__} keys, got {shown(value)}")
    return config_from_mapping(tp, value, source=tp.__name__)


#: The plain field types and their coercion (nothing else is converted silently).
_SCALARS: dict[Any, Any] = {bool: _bool, int: _to_int, float: _to_float, str: _to_str,
                            dict: _to_dict, Any: lambda v: v}


def coerce(tp: Any, value: Any) -> Any:
    """``value`` (from YAML, JSON or a parsed flag) as type ``tp``; ValueError when it does not fit.

    Strings are parsed (``"3"`` for an int, ``"a,b"`` for a tuple, JSON for a dict); lists
    become tuples; an int is accepted for a float; nothing else is converted silently.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _to_union(tp, value)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"expected one of {list(typing.get_args(tp))}, got {shown(value)}")
        return value
    if origin is tuple:
        return _to_tuple(tp, value)
    if origin is dict:
        return _to_dict(value)
    if tp in _SCALARS:
        return _SCALARS[tp](value)
    if dataclasses.is_dataclass(tp):  # a nested section (e.g. ``trainer``)
        return _to_section(tp, value)
    raise TypeError(f"config fields of type {type_name(tp)} are not supported")


def field_value(f: dataclasses.Field, tp: Any, value: Any) -> Any:
    """``value`` coerced to the type of field ``f`` and held to its declaration
    (:func:`declared_problem`); ``ValueError`` (``expected ..., got ...``) when it breaks either."""
    value = coerce(tp, value)
    problem = declared_problem(f, tp, value)
    if problem is not None:
        raise ValueError(problem)
    return value


def parse_field_text(cls: type, name: str, text: str) -> Any:
    """Parse one command-line string for field ``name`` of ``cls``."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    try:
        return field_value(f, field_types(cls)[name], text)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


# ---------------------------------------------------------------------- building configs
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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [key for key in data if key not in types_]
    if unknown:
        raise _unknown_keys(f"{source} ({prefix.rstrip('.')})" if prefix else source, cls, unknown)
    for key, value in data.items():
        if key in subs and isinstance(value, Mapping):
            _check_mapping(subs[key], value, source=source, prefix=f"{prefix}{key}.")
            continue
        try:
            field_value(fields[key], types_[key], value)
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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(types_))
    if unknown:
        raise _unknown_keys(source, cls, unknown)
    values = {}
    for key, value in data.items():
        try:
            values[key] = field_value(fields[key], types_[key], value)
        except ValueError as exc:
            raise ValueError(f"{blame.get(key, source)}: {key}: {exc}") from None
    return cls(**values)


#: What YAML reads an unquoted key as, by its resolved tag (a key must be a string).
_YAML_KEY_KINDS = {"int": "a number", "float": "a number", "bool": "a boolean", "null": "null",
                   "timestamp": "a date", "seq": "a list", "map": "a mapping"}


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` within bounds, every refusal a ``yaml.YAMLError``:

    - no aliases (``*name``): nine nested aliases of nine items expand a 342-byte file to a
      billion nodes;
    - nested at most :data:`MAX_CONFIG_DEPTH` levels (the composer recurses per level);
    - every mapping key a string: YAML reads ``1``, ``yes`` and ``~`` as a number, a boolean
      and null, which no config key, flag name or kwarg can be.

    Every YAML this project reads (configs, run dirs, env kwargs) goes through it."""
    import yaml

    class Bounded(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                raise yaml.YAMLError(f"an alias (*{event.anchor}) at {_at(event.start_mark)}: "
                                     "aliases are not allowed (write the value out)")
            if self.depth >= MAX_CONFIG_DEPTH:
                raise yaml.YAMLError(f"nested more than {MAX_CONFIG_DEPTH} levels deep at "
                                     f"{_at(self.peek_event().start_mark)}")
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            for key, _ in node.value:
                kind = key.tag.rsplit(":", 1)[-1]
                if kind in ("str", "merge"):
                    continue
                what = _YAML_KEY_KINDS.get(kind, f"a {kind}")
                if not isinstance(key.value, str):
                    raise yaml.YAMLError(f"the key at {_at(key.start_mark)} is {what}, not a string")
                raise yaml.YAMLError(f"the key {key.value} at {_at(key.start_mark)} is {what}, not a string "
                                     f"(keys must be strings: quote it, '{key.value}')")
            return super().construct_mapping(node, deep)

    loader = Bounded(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file holding one mapping (empty file: empty mapping)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"config file {str(p)!r} does not exist")
    try:
        loaded = load_yaml(p.read_text())
    except yaml.YAMLError as exc:  # a marked error is the parser's; an unmarked one a bound of load_yaml
        what = "is not valid YAML" if isinstance(exc, yaml.MarkedYAMLError) else "is refused"
        raise ValueError(f"config file {str(p)!r} {what}: {' '.join(str(exc).split())}") from None
    loaded = loaded or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"config file {str(p)!r} must hold a mapping, got {type(loaded).__name__}")
    return loaded


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
    """``(name, type name, default, help)`` for every field of ``cls`` (the help ends with the
    declared range, ``(in [1, 1000000])``); a nested section lists its own fields as
    ``section.name`` instead of itself."""
    types_ = field_types(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(types_[f.name]):
            out += config_help(types_[f.name], prefix=f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        within = f.metadata.get("within")  # the declared range is part of what --help says
        text = f.metadata.get("help", "")
        text = (text() if callable(text) else text) + (f" (in {within})" if within is not None else "")
        out.append((prefix + f.name, type_name(types_[f.name]), default, text))
    return out
