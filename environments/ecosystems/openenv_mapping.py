"""Text <-> OpenEnv JSON: the model's text as an env's Action JSON, an observation as text.

:func:`action_payload` makes the Action JSON (``{action_field: text}``, or what an
``action_parser`` returns), :func:`render_observation` picks the text shown to the model,
and :func:`load_object` loads the ``"module:function"`` a parser is named by.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from trace_gym.env.boundary import error_text
from trace_gym.utils.targets import load_target


def load_object(target: str, what: str) -> Any:
    """The object ``"module:attr"`` names; one line naming ``target`` when it cannot."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} must be 'module:function', got {target!r}")
    try:
        obj = load_target(target)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what}={target!r} cannot be loaded ({error_text(exc)})") from None
    return obj


def action_payload(text: str, action_field: str, parser: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """The env's Action JSON for the model's ``text``: ``parser(text)`` (a dict or a
    pydantic model) when given, else ``{action_field: text}``.

    Raises:
        TypeError: a parser that returns something else (named).
    """
    if parser is None:
        return {action_field: text}
    made = parser(text)
    if hasattr(made, "model_dump"):
        made = made.model_dump()
    if not isinstance(made, Mapping):
        raise TypeError(f"action_parser returned {type(made).__name__} {made!r:.100}; it must return a dict "
                        "(the env's Action JSON) or a pydantic Action")
    return dict(made)


def render_observation(observation: Mapping[str, Any], field: str | None = None) -> str:
    """The text of an OpenEnv observation (its JSON without ``reward``/``done``/``metadata``):
    ``observation[field]`` when ``field`` is given, else its only string-valued field, else
    the whole observation as JSON with sorted keys. Non-string values are written as JSON.

    Raises:
        ValueError: ``field`` is not in the observation (its fields named).
    """
    if field is not None:
        if field not in observation:
            raise ValueError(f"observation_field={field!r} is not in the observation; it has {sorted(observation)}")
        value = observation[field]
    else:
        strings = [key for key, value in observation.items() if isinstance(value, str)]
        value = observation[strings[0]] if len(strings) == 1 else dict(observation)
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
