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
- unknown keys get the closest known key (:func:`trace_gym.utils.suggest.did_you_mean`).

argparse itself lives in ``trace_gym/cli.py`` alone; it asks this module what flags a
config has and how to parse them.

This module is the loader machinery only and imports nothing of ``trace_gym`` but the leaf
:mod:`trace_gym.utils.suggest`: each entry point's config lives beside it
(:data:`trace_gym.commands.ENTRY_CONFIGS` lists them), composed of the shared sections of
:mod:`trace_gym.config_sections`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from trace_gym.utils.suggest import did_you_mean

C = TypeVar("C")


def doc(text: str | Callable[[], str]) -> dict[str, Any]:
    """Field metadata holding the field's help text: a string, or a function that writes it
    when help is shown (a list of names that plugins and the face add to after import)."""
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


def _to_int(value: Any) -> int:
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


def _to_float(value: Any) -> float:
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


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _to_dict(value: Any) -> dict:
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON object, got {value!r} ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping, got {value!r}")
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
    raise ValueError(f"expected {type_name(tp)}, got {value!r}")


def _to_tuple(tp: Any, value: Any) -> tuple:
    args = typing.get_args(tp)
    item = args[0] if args else Any
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list for {type_name(tp)}, got {value!r}")
    return tuple(value if item is Any else (coerce(item, v) for v in value))


def _to_section(tp: type, value: Any) -> Any:
    if dataclasses.is_dataclass(value) and isinstance(value, tp):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of {tp.__name__} keys, got {value!r}")
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
            raise ValueError(f"expected one of {list(typing.get_args(tp))}, got {value!r}")
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


def parse_field_text(cls: type, name: str, text: str) -> Any:
    """Parse one command-line string for field ``name`` of ``cls``."""
    tp = field_types(cls)[name]
    try:
        return coerce(tp, text)
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


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` without aliases: ``*name`` is refused (``yaml.YAMLError``),
    since nine nested aliases of nine items expand a 342-byte file to a billion nodes.
    Every YAML this project reads (configs, run dirs, env kwargs) goes through it."""
    import yaml

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.events.AliasEvent):
                event = self.peek_event()
                mark = event.start_mark
                raise yaml.YAMLError(f"an alias (*{event.anchor}) at line {mark.line + 1}, column {mark.column + 1}: "
                                     "aliases are not allowed (write the value out)")
            return super().compose_node(parent, index)

    loader = NoAliases(text)
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
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {str(p)!r} is not valid YAML: {exc}") from None
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
        text = f.metadata.get("help", "")
        out.append((prefix + f.name, type_name(types_[f.name]), default, text() if callable(text) else text))
    return out
