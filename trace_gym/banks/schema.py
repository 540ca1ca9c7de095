"""The schema of a bank's lines (``docs/banks.md``), checked field by field on every read and write.

A bank's checksum catches accidents (a flipped bit, a truncated copy), not intent:
whoever edits a line can recompute it. So the readers
(:func:`~trace_gym.banks.format.scan_bank`, :func:`~trace_gym.banks.format.iter_prompts`,
:func:`~trace_gym.banks.format.read_header`) and the writer check every line against
this schema before other code sees it, and the replay and the stats index what they
accept without guarding:

- types: every documented field present with its type (an object where an object
  belongs, a string, an integer that is not a bool, a list);
- ranges: counts (tokens, env steps, indices) are integers in 0..2**53 (R and K at most
  1024, an episode's last depth at most the manifest's ``agent.max_turns`` or 256), a reward is
  a finite number, an episode's ``end`` one of :data:`ENDS`;
- consistency: an episode has a reward exactly when it has turns, and ``success`` is
  ``reward >= SUCCESS_THRESHOLD``; turn depths count up from the anchor (a root's first
  turn is depth 1, a continuation of the prefix at depth t starts at t + 1); a prefix
  lies strictly inside its root (depth 1 .. turns - 1), prefixes are in increasing depth,
  at most the manifest's cap of them, and with ``left_out`` they are exactly the root's
  depths 1 .. turns - 1; a prompt holds R roots and a prefix K continuations (the
  manifest's); a turn's prefill is at most its context.

A violation is a :class:`BankError` naming the field by its path in the line (for
example ``roots[2].prefixes[0].continuations[1].turns[0].policy_tokens``); the readers
put the file and the line number in front.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Mapping, Sequence

from trace_gym.utils.textsafe import first_unencodable
from trace_gym.tree import SUCCESS_THRESHOLD

#: Largest count a bank may hold (tokens, env steps, indices): exact as a float.
MAX_COUNT = 2**53
#: Largest R (roots per prompt) and K (continuations per prefix) a manifest may declare.
MAX_ROOTS = MAX_CONTINUATIONS = 1024
#: Most turns an episode may reach (its last depth) when the manifest names no ``agent.max_turns``,
#: and the most that one may name: replaying a root costs about the square of its turns.
MAX_TURNS = 256
#: Longest task id (characters): the index keeps every prompt's id in memory.
MAX_TASK_ID_CHARS = 1024
#: How an episode may end (``trace_gym.banks.record.episode_end``): ``error`` exactly when it has no turn.
ENDS = ("terminated", "truncated", "max_turns", "episode_tokens", "env_error", "cut", "error")
#: Keys of every recorded turn (a tree node): what predictors read, and its exact costs.
TURN_KEYS = ("depth", "action", "observation", "finish_reason", "truncation", "env_error", "cached_tokens",
             "policy_tokens", "observation_tokens", "context_tokens", "prefill_tokens", "env_steps")
EPISODE_KEYS = ("error", "reward", "success", "end", "turns")
_TURN_KEYSET = frozenset(TURN_KEYS)
_EPISODE_KEYSET = frozenset(EPISODE_KEYS)
_COUNT_KEYS = ("policy_tokens", "observation_tokens", "context_tokens", "prefill_tokens", "env_steps")
_TEXT_KEYS = ("finish_reason", "truncation", "env_error")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TEXT = frozenset({str, type(None)})
_ENDS = frozenset(ENDS)
_episode_values = operator.itemgetter(*EPISODE_KEYS)
_turn_values = operator.itemgetter(*TURN_KEYS)
#: Every allowed tuple of the types of a turn's fields, in :data:`TURN_KEYS` order.
_TURN_TYPES = frozenset(
    (int, str, list, finish, truncation, env_error, cached, int, int, int, int, int)
    for finish in _TEXT for truncation in _TEXT for env_error in _TEXT for cached in (int, type(None)))
_COUNT = f"an integer in 0..{MAX_COUNT}"


class BankError(ValueError):
    """A bank file that is malformed, incomplete, tampered with, or not a bank; the message names it."""


def show(value: Any) -> str:
    """``value`` for an error message: its repr, at most 60 characters, on one line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse(where: str, value: Any, expected: str) -> None:
    raise BankError(f"{where} is {show(value)}, expected {expected}")


def _need(obj: Any, keys: Sequence[str], where: str) -> None:
    if type(obj) is not dict:
        _refuse(where, obj, "an object")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise BankError(f"{where} lacks {', '.join(missing)}")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _is_integer(value: Any) -> bool:
    return type(value) is int and -MAX_COUNT <= value <= MAX_COUNT


def _is_number(value: Any) -> bool:
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and -MAX_COUNT <= value <= MAX_COUNT


def _check_optional(obj: Mapping[str, Any], where: str, counts: Sequence[str] = (), numbers: Sequence[str] = (),
                    texts: Sequence[str] = (), objects: Sequence[str] = (), lists: Sequence[str] = ()) -> None:
    """Type-check the keys of ``obj`` that are optional: each absent, or of its kind
    (a text may be null)."""
    for key in counts:
        if key in obj and not _is_count(obj[key]):
            _refuse(f"{where}{key}", obj[key], _COUNT)
    for key in numbers:
        if key in obj and not _is_number(obj[key]):
            _refuse(f"{where}{key}", obj[key], "a finite number")
    for key in texts:
        if obj.get(key) is not None and type(obj[key]) is not str:
            _refuse(f"{where}{key}", obj[key], "a string or null")
    for key in objects:
        if key in obj and type(obj[key]) is not dict:
            _refuse(f"{where}{key}", obj[key], "an object")
    for key in lists:
        if key in obj and type(obj[key]) is not list:
            _refuse(f"{where}{key}", obj[key], "a list")


def check_encodable(value: Any, where: str = "") -> None:
    """``BankError`` naming the first string of a parsed line (a value or an object key) that
    UTF-8 cannot encode (a lone surrogate, from a JSON escape such as ``\\ud800``): a tokenizer,
    an embedder or an HTTP client downstream would raise on it."""
    if type(value) is str:
        at = first_unencodable(value)
        if at is not None:
            raise BankError(f"{where or 'the line'} holds a lone surrogate (U+{ord(value[at]):04X}) at character "
                            f"{at}, which UTF-8 cannot encode")
    elif type(value) is list:
        for n, item in enumerate(value):
            check_encodable(item, f"{where}[{n}]")
    elif type(value) is dict:
        for key, item in value.items():
            name = f"{where}.{key}" if where else str(key)
            if first_unencodable(key) is not None:
                check_encodable(key, f"a key in {where or 'the line'}")
            check_encodable(item, name)


# ---------------------------------------------------------------------- header, run, footer
def check_manifest(manifest: Any) -> None:
    """``BankError`` unless ``manifest`` is a header's manifest: ``roots`` (R >= 1) and
    ``continuations`` (K >= 0) integers, ``max_prefixes_per_root`` null or >= 1, and every
    other documented key absent or of its type."""
    _need(manifest, ("roots", "continuations"), "manifest")
    if not _is_count(manifest["roots"]) or not 1 <= manifest["roots"] <= MAX_ROOTS:
        _refuse("manifest.roots", manifest["roots"], f"an integer in 1..{MAX_ROOTS}")
    if not _is_count(manifest["continuations"]) or manifest["continuations"] > MAX_CONTINUATIONS:
        _refuse("manifest.continuations", manifest["continuations"], f"an integer in 0..{MAX_CONTINUATIONS}")
    cap = manifest.get("max_prefixes_per_root")
    if cap is not None and (not _is_count(cap) or cap < 1):
        _refuse("manifest.max_prefixes_per_root", cap, f"null or an integer in 1..{MAX_COUNT}")
    _check_optional(manifest, "manifest.", counts=("prompts",), numbers=("seed", "created_at"),
                    texts=("policy", "policy_path", "weights_sha256", "engine", "env_id"),
                    objects=("env_kwargs", "task_loader_kwargs", "sampling", "agent"), lists=("command",))
    limit = manifest.get("agent", {}).get("max_turns")
    if limit is not None and (not _is_count(limit) or not 1 <= limit <= MAX_TURNS):
        _refuse("manifest.agent.max_turns", limit, f"an integer in 1..{MAX_TURNS}")


def max_turns(manifest: Mapping[str, Any]) -> tuple[int, str]:
    """The last depth an episode of a bank with ``manifest`` may reach, and how to name that bound."""
    limit = (manifest.get("agent") or {}).get("max_turns")
    if limit is None:
        return MAX_TURNS, f"{MAX_TURNS} (the most a bank may hold)"
    return limit, f"the manifest's agent.max_turns = {limit}"


def check_run(line: Mapping[str, Any], position: int | None = None) -> None:
    """``BankError`` unless ``line`` is a run line (``run``, the count of runs before it
    when ``position`` is given; ``command``; ``started_at``)."""
    _need(line, ("run", "started_at"), "the run line")
    if not _is_count(line["run"]) or (position is not None and line["run"] != position):
        _refuse("run", line["run"], f"{position} (the runs before it)" if position is not None else _COUNT)
    if not _is_number(line["started_at"]):
        _refuse("started_at", line["started_at"], "a finite number (unix seconds)")
    _check_optional(line, "", lists=("command",))


def check_footer(line: Mapping[str, Any]) -> None:
    """``BankError`` unless ``line`` is a footer (``prompts`` count, ``sha256`` of 64 hex
    digits, and the optional totals of their types)."""
    _need(line, ("prompts", "sha256"), "the footer")
    if not _is_count(line["prompts"]):
        _refuse("prompts", line["prompts"], _COUNT)
    if type(line["sha256"]) is not str or not _SHA256.fullmatch(line["sha256"]):
        _refuse("sha256", line["sha256"], "64 lowercase hex digits")
    _check_optional(line, "", counts=("runs", "tasks"), numbers=("finished_at", "seconds"), objects=("last_run",))


# ---------------------------------------------------------------------- a prompt line
def check_prompt_record(record: Any, manifest: Mapping[str, Any]) -> None:
    """``BankError`` unless ``record`` is a prompt line of a bank with ``manifest`` (see the
    module docstring for what is checked); the message names the first bad field."""
    _need(record, ("task", "roots"), "the prompt line")
    task = record["task"]
    _need(task, ("id", "prompt"), "task")
    if type(task["id"]) is not str or not 0 < len(task["id"]) <= MAX_TASK_ID_CHARS:
        _refuse("task.id", task["id"], f"a non-empty string of at most {MAX_TASK_ID_CHARS} characters")
    if type(task["prompt"]) is not str:
        _refuse("task.prompt", task["prompt"], "a string")
    _check_optional(record, "", counts=("task_index", "prompt_tokens", "run"), numbers=("written_at",))
    roots = record["roots"]
    if type(roots) is not list:
        _refuse("roots", roots, "a list of episodes")
    k, cap = manifest["continuations"], manifest.get("max_prefixes_per_root")
    limit = max_turns(manifest)
    for j, root in enumerate(roots):
        _check_root(root, f"roots[{j}]", k, cap, limit)
    if len(roots) != manifest["roots"]:
        raise BankError(f"roots holds {len(roots)} episodes, the manifest says R = {manifest['roots']}")


def _check_root(root: Any, where: str, k: int, cap: int | None, limit: tuple[int, str]) -> None:
    _episode(root, where, 0)
    turns = len(root["turns"])
    if turns > limit[0]:
        raise BankError(f"{where}.turns holds {turns} turns, more than {limit[1]}")
    _need(root, ("prefixes", "left_out"), where)
    if "seed" in root and not _is_integer(root["seed"]):
        _refuse(f"{where}.seed", root["seed"], f"an integer in -{MAX_COUNT}..{MAX_COUNT}")
    prefixes = root["prefixes"]
    if type(prefixes) is not list:
        _refuse(f"{where}.prefixes", prefixes, "a list")
    last = 0
    for i, prefix in enumerate(prefixes):
        at = f"{where}.prefixes[{i}]"
        _need(prefix, ("depth", "continuations"), at)
        depth = prefix["depth"]
        if type(depth) is not int or not last < depth < turns:
            _refuse(f"{at}.depth", depth, f"an integer in {last + 1}..{turns - 1} (inside the root's {turns} turns, "
                                          "after the prefix before it)")
        last = depth
        continuations = prefix["continuations"]
        if type(continuations) is not list:
            _refuse(f"{at}.continuations", continuations, "a list of episodes")
        for c, cont in enumerate(continuations):
            if not _episode_ok(cont, depth):
                _episode(cont, f"{at}.continuations[{c}]", depth)
            if depth + len(cont["turns"]) > limit[0]:
                raise BankError(f"{at}.continuations[{c}].turns ends at depth {depth + len(cont['turns'])}, more "
                                f"than {limit[1]}")
            if "replayed_env_steps" in cont and not _is_count(cont["replayed_env_steps"]):
                _refuse(f"{at}.continuations[{c}].replayed_env_steps", cont["replayed_env_steps"], _COUNT)
        if len(continuations) != k:
            raise BankError(f"{at}.continuations holds {len(continuations)} episodes, the manifest says K = {k}")
    if cap is not None and len(prefixes) > cap:
        raise BankError(f"{where}.prefixes holds {len(prefixes)} prefixes, the manifest caps them at {cap}")
    left_out = root["left_out"]
    recorded = {p["depth"] for p in prefixes}
    expected = [d for d in range(1, turns) if d not in recorded]
    if type(left_out) is not list or any(type(d) is not int for d in left_out) or sorted(left_out) != expected:
        _refuse(f"{where}.left_out", left_out, f"{expected} (the depths 1..{turns - 1} without a recorded prefix)")


def _episode_ok(ep: Any, start: int) -> bool:
    """Whether :func:`_check_episode` would pass ``ep``, turns included, without building a
    field name (the fast test; the slow one says what is wrong)."""
    try:
        error, reward, success, end, turns = _episode_values(ep)
    except (KeyError, TypeError):
        return False
    if type(turns) is not list or (error is not None and type(error) is not str) or type(end) is not str \
            or end not in _ENDS:
        return False
    if not turns:
        return reward is None and success is None and end == "error"
    if not _is_number(reward) or success is not (reward >= SUCCESS_THRESHOLD) or end == "error":
        return False
    for turn in turns:
        start += 1
        if not _turn_ok(turn, start):
            return False
    return True


def _episode(ep: Any, where: str, start: int) -> None:
    """``BankError`` naming the field unless ``ep`` is an episode whose turns start after depth ``start``."""
    if not _episode_ok(ep, start):
        _check_episode(ep, where, start)
        raise BankError(f"{where} is malformed")  # not reached: _check_episode refuses what _episode_ok does


def _check_episode(ep: Any, where: str, start: int) -> None:
    """The slow test of one episode, whose refusal names the field (see :func:`_episode`)."""
    if type(ep) is not dict or not _EPISODE_KEYSET <= ep.keys():
        _need(ep, EPISODE_KEYS, where)
    turns, reward, success, end = ep["turns"], ep["reward"], ep["success"], ep["end"]
    if type(turns) is not list:
        _refuse(f"{where}.turns", turns, "a list of turns")
    if ep["error"] is not None and type(ep["error"]) is not str:
        _refuse(f"{where}.error", ep["error"], "a string or null")
    if end not in ENDS or type(end) is not str:
        _refuse(f"{where}.end", end, f"one of {', '.join(ENDS)}")
    if turns:
        if not _is_number(reward):
            _refuse(f"{where}.reward", reward, "a finite number (the episode has turns)")
        won = reward >= SUCCESS_THRESHOLD
        if success is not won:
            _refuse(f"{where}.success", success, f"{won} (reward {show(reward)} against the success threshold "
                                                 f"{SUCCESS_THRESHOLD})")
        if end == "error":
            _refuse(f"{where}.end", end, "how an episode with turns ended (not 'error')")
    else:
        for key, value in (("reward", reward), ("success", success)):
            if value is not None:
                _refuse(f"{where}.{key}", value, "null (the episode has no turns)")
        if end != "error":
            _refuse(f"{where}.end", end, "'error' (the episode has no turns)")
    for n, turn in enumerate(turns):
        if not _turn_ok(turn, start + n + 1):
            _check_turn(turn, where, n, start + n + 1)
            raise BankError(f"{where}.turns[{n}] is malformed")  # not reached: _check_turn refuses what _turn_ok does


def _turn_ok(turn: Any, depth: int) -> bool:
    """Whether :func:`_check_turn` would pass ``turn``, in a few C-level calls (a bank has tens of
    thousands of turns; this keeps the check a small part of reading them): the types of all
    its fields at once against :data:`_TURN_TYPES`, then the ranges."""
    try:
        values = _turn_values(turn)
    except (KeyError, TypeError):
        return False
    if tuple(map(type, values)) not in _TURN_TYPES or values[0] != depth:
        return False
    counts = values[7:12]  # policy, observation, context, prefill tokens; env steps
    if min(counts) < 0 or max(counts) > MAX_COUNT or counts[3] > counts[2]:
        return False
    if values[6] is not None and not 0 <= values[6] <= MAX_COUNT:
        return False
    for message in values[2]:
        if type(message) is not dict or type(message.get("role")) is not str \
                or type(message.get("content", 0)) not in _TEXT:
            return False
    return True


def _check_turn(turn: Any, where: str, n: int, depth: int) -> None:
    if type(turn) is not dict or not _TURN_KEYSET <= turn.keys():
        _need(turn, TURN_KEYS, f"{where}.turns[{n}]")
    if type(turn["depth"]) is not int or turn["depth"] != depth:
        _refuse(f"{where}.turns[{n}].depth", turn["depth"], f"{depth} (the turns count up from the anchor)")
    if type(turn["action"]) is not str:
        _refuse(f"{where}.turns[{n}].action", turn["action"], "a string")
    for key in _COUNT_KEYS:
        value = turn[key]
        if type(value) is not int or not 0 <= value <= MAX_COUNT:
            _refuse(f"{where}.turns[{n}].{key}", value, _COUNT)
    cached = turn["cached_tokens"]
    if cached is not None and not _is_count(cached):
        _refuse(f"{where}.turns[{n}].cached_tokens", cached, f"null or {_COUNT}")
    for key in _TEXT_KEYS:
        if turn[key] is not None and type(turn[key]) is not str:
            _refuse(f"{where}.turns[{n}].{key}", turn[key], "a string or null")
    if turn["prefill_tokens"] > turn["context_tokens"]:
        _refuse(f"{where}.turns[{n}].prefill_tokens", turn["prefill_tokens"],
                f"at most context_tokens ({turn['context_tokens']})")
    observation = turn["observation"]
    if type(observation) is not list:
        _refuse(f"{where}.turns[{n}].observation", observation, "a list of messages")
    for m, message in enumerate(observation):
        at = f"{where}.turns[{n}].observation[{m}]"
        _need(message, ("role", "content"), at)
        if type(message["role"]) is not str:
            _refuse(f"{at}.role", message["role"], "a string")
        if message["content"] is not None and type(message["content"]) is not str:
            _refuse(f"{at}.content", message["content"], "a string or null")
