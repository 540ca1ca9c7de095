"""Parse one model turn of WikiQA into a search, an answer, or a readable problem.

Two protocols:

``tags`` (Search-R1's)
    The first ``<search>query</search>`` or ``<answer>text</answer>`` in the turn (whichever
    comes first) is the action; text around it (``<think>`` reasoning) is ignored. No tag:
    the fixed :data:`INVALID_ACTION` message.
``tool_call``
    The first ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block (Qwen /
    Hermes style; ``arguments`` may also be a JSON string, OpenAI style) calling
    ``search(query)`` or ``answer(answer)``. No block: :data:`INVALID_TOOL_ACTION`; a
    block that is not valid JSON, names another tool, or lacks its argument gets a
    message that says which.

Queries are cleaned before searching: control and format characters and lone
surrogates (Unicode categories Cc, Cf, Cs; a surrogate cannot be encoded, and would make
every searcher raise) are removed and whitespace is collapsed; answers lose their lone
surrogates. An empty query, or one over ``max_query_chars`` characters, becomes a
problem message instead of a search.

A tool-call block is measured before it is parsed (:func:`trace_gym.utils.textsafe.loads_bounded`:
at most :data:`MAX_TOOL_CALL_DEPTH` levels of nesting, no number of more than
:data:`MAX_TOOL_CALL_DIGITS` digits), and any failure to read it is a
``bad_tool_call`` message: no model text makes :func:`parse_action` raise.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from trace_gym.utils.textsafe import JSONRefused, drop_unencodable, first_tagged, loads_bounded, tagged_blocks

PROTOCOLS = ("tags", "tool_call")
#: Deepest nesting of a tool-call block (``{"name", "arguments": {...}}`` is 2 levels).
MAX_TOOL_CALL_DEPTH = 16
#: Longest run of digits in a tool-call block (no argument of either tool is a number).
MAX_TOOL_CALL_DIGITS = 100

#: The observation for a ``tags`` turn with neither a search nor an answer tag (fixed text).
INVALID_ACTION = (
    "Invalid action: no <search> or <answer> tag found. To search, write <search> your query </search>. "
    "To give your final answer, write <answer> your answer </answer>."
)
#: The observation for a ``tool_call`` turn without any ``<tool_call>`` block (fixed text).
INVALID_TOOL_ACTION = (
    'Invalid action: no tool call found. To search, write <tool_call>{"name": "search", "arguments": '
    '{"query": "your query"}}</tool_call>. To answer, write <tool_call>{"name": "answer", "arguments": '
    '{"answer": "your answer"}}</tool_call>.'
)
ACTION_TOO_LONG = "Invalid action: the response has {chars} characters; the limit is {limit}. Nothing was searched."
QUERY_EMPTY = "Invalid search: the query is empty (after removing control characters). Nothing was searched."
QUERY_TOO_LONG = "Invalid search: the query has {chars} characters; the limit is {limit}. Use a shorter query."
BAD_TOOL_CALL = "Invalid tool call: {problem}"
QUERY_REFUSED = "Invalid search: the search engine cannot search this query ({reason}). Nothing was searched."


#: JSON schemas of the two tools (``info["tool_schemas"]``), OpenAI style.
TOOL_SCHEMAS = (
    {"type": "function", "function": {
        "name": "search", "description": "Search the encyclopedia; returns the top passages.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "search query"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the final answer and end the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string", "description": "a short answer"}},
                       "required": ["answer"]}}},
)


@dataclass(frozen=True)
class Action:
    """One parsed turn.

    Attributes:
        kind: ``search``, ``answer`` or ``invalid``.
        text: the cleaned query (search), the raw answer (answer), or the message
            shown to the model (invalid).
        error: a short code for invalid actions (``no_action``, ``action_too_long``,
            ``empty_query``, ``query_too_long``, ``bad_tool_call``), else ``None``.
    """

    kind: str
    text: str
    error: str | None = None


_DROPPED = ("Cc", "Cf", "Cs")


def clean_query(query: str) -> str:
    """Drop control/format characters and lone surrogates (Unicode Cc, Cf, Cs) and collapse whitespace."""
    kept = "".join(" " if ch in "\t\n\r\v\f" else ch for ch in query
                   if ch in "\t\n\r\v\f" or unicodedata.category(ch) not in _DROPPED)
    return " ".join(kept.split())


def parse_action(text: object, protocol: str = "tags", *, max_action_chars: int = 65536,
                 max_query_chars: int = 512) -> Action:
    """Parse one turn (see the module docstring). Never raises on model text."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if not isinstance(text, str):
        text = ""
    if len(text) > max_action_chars:
        return Action("invalid", ACTION_TOO_LONG.format(chars=len(text), limit=max_action_chars), "action_too_long")
    if protocol == "tags":
        found = first_tagged(text, ("search", "answer"))
        if found is None:
            return Action("invalid", INVALID_ACTION, "no_action")
        kind, body = found
    else:
        block = next(tagged_blocks(text, "<tool_call>", "</tool_call>"), None)
        if block is None:
            return Action("invalid", INVALID_TOOL_ACTION, "no_action")
        parsed = _parse_tool_call(block[1])
        if isinstance(parsed, Action):
            return parsed
        kind, body = parsed
    if kind == "answer":
        return Action("answer", drop_unencodable(body).strip())
    query = clean_query(body)
    if not query:
        return Action("invalid", QUERY_EMPTY, "empty_query")
    if len(query) > max_query_chars:
        return Action("invalid", QUERY_TOO_LONG.format(chars=len(query), limit=max_query_chars), "query_too_long")
    return Action("search", query)


def _parse_tool_call(block: str) -> tuple[str, str] | Action:
    def bad(problem: str) -> Action:
        return Action("invalid", BAD_TOOL_CALL.format(problem=problem), "bad_tool_call")

    try:
        call = _loads(block)
    except JSONRefused as exc:
        return bad(f"the block {exc}.")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return bad('expected a JSON object with "name" and "arguments".')
    name, args = call["name"], call.get("arguments", {})
    if isinstance(args, str):
        try:
            args = _loads(args)
        except JSONRefused as exc:
            return bad(f'"arguments" is a string that {exc}.')
    if name not in ("search", "answer"):
        return bad(f'unknown tool {drop_unencodable(name[:80])!r}; the tools are "search" and "answer".')
    field = "query" if name == "search" else "answer"
    if not isinstance(args, dict) or not isinstance(args.get(field), str):
        return bad(f'{name} needs a string argument "{field}".')
    return name, args[field]


def _loads(text: str):
    return loads_bounded(text, max_depth=MAX_TOOL_CALL_DEPTH, max_digits=MAX_TOOL_CALL_DIGITS)
