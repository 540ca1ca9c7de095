"""BFCL v4 multi-turn data: entries, ground truth, function docs, prompts, the split.

Everything is read from the files that ship inside the ``bfcl-eval`` package
(``bfcl_eval/data``); nothing is downloaded. Only pure modules of that package are
imported (``bfcl_eval.constants.*``), never its model handlers or API clients.

Install: ``pip install --no-deps bfcl-eval`` (its declared dependencies pin old
numpy/faiss and pull API clients that the multi-turn backends do not need; the
backends need only ``mpmath``).

Tiers (:func:`sample_tasks`): ``multi_turn``, the entries themselves; ``single_call``, the
first user turn of an entry whose ground truth is one call (:func:`single_call_task`), the
family's easiest honest tier.

Split: entry ``multi_turn_<category>_<i>`` shares its scenario with the same ``i`` in
the other three categories, so the split is by scenario index ``i``, identical across
categories: the 40 indices (of 200) with the smallest
``sha256(f"bfcl-multi-turn/{i}")`` hex digest form ``eval``, the other 160 ``train``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from trace_gym.types import Task

#: The four BFCL v4 multi-turn categories (200 entries each).
CATEGORIES = (
    "multi_turn_base",
    "multi_turn_long_context",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
)
SPLITS = ("all", "train", "eval")
ENTRIES_PER_CATEGORY = 200
EVAL_FRACTION = 0.2
_SPLIT_SALT = "bfcl-multi-turn/"

#: The eight backend classes of the multi-turn categories.
BACKEND_CLASSES = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)

_INSTALL_HINT = "BFCL needs the bfcl-eval package: pip install --no-deps bfcl-eval"


def _bfcl_constants():
    try:
        from bfcl_eval.constants import default_prompts, executable_backend_config
    except ImportError as exc:  # pragma: no cover - exercised only without bfcl-eval
        raise ImportError(_INSTALL_HINT) from exc
    return default_prompts, executable_backend_config


@functools.lru_cache(maxsize=1)
def data_dir() -> Path:
    """``bfcl_eval/data`` inside the installed package."""
    try:
        import bfcl_eval
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    path = Path(bfcl_eval.__file__).resolve().parent / "data"
    if not (path / "BFCL_v4_multi_turn_base.json").is_file():
        raise FileNotFoundError(f"bfcl-eval at {path} has no BFCL_v4_multi_turn_base.json")
    return path


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def check_category(category: str) -> str:
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
    return category


def category_of(entry_id: str) -> str:
    """``multi_turn_base_12`` -> ``multi_turn_base``."""
    category = entry_id.rsplit("_", 1)[0]
    return check_category(category)


def scenario_index(entry_id: str) -> int:
    """``multi_turn_base_12`` -> 12."""
    tail = entry_id.rsplit("_", 1)[-1]
    if not tail.isdigit():
        raise ValueError(f"BFCL entry id must end in _<index>, got {entry_id!r}")
    return int(tail)


@functools.lru_cache(maxsize=None)
def load_entries(category: str) -> tuple[dict, ...]:
    """The raw entries of one category, each with its ``ground_truth`` merged in.

    Keys: ``id``, ``question`` (list of turns, each a list of message dicts; a
    miss_func holdout turn is ``[]``), ``initial_config``, ``involved_classes``,
    ``missed_function`` (miss_func only: turn index -> function names), ``path``,
    ``ground_truth`` (list of turns, each a list of call strings).
    Treat the returned dicts as read-only; they are shared.
    """
    check_category(category)
    entries = _read_jsonl(data_dir() / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(data_dir() / "possible_answer" / f"BFCL_v4_{category}.json")}
    for entry in entries:
        if entry["id"] not in answers:
            raise ValueError(f"{entry['id']} has no possible answer")
        entry["ground_truth"] = answers[entry["id"]]
        if len(entry["ground_truth"]) != len(entry["question"]):
            raise ValueError(f"{entry['id']}: {len(entry['question'])} turns but {len(entry['ground_truth'])} answers")
    return tuple(entries)


@functools.lru_cache(maxsize=None)
def _entry_index(category: str) -> dict[str, dict]:
    return {e["id"]: e for e in load_entries(category)}


def get_entry(entry_id: str) -> dict:
    """The raw entry (with ``ground_truth``) for an id such as ``multi_turn_base_0``."""
    index = _entry_index(category_of(entry_id))
    if entry_id not in index:
        raise KeyError(f"unknown BFCL entry id {entry_id!r}")
    return index[entry_id]


@functools.lru_cache(maxsize=1)
def eval_indices() -> frozenset[int]:
    """Scenario indices of the eval split (40 of 200, fixed by a salted sha256)."""
    n_eval = round(ENTRIES_PER_CATEGORY * EVAL_FRACTION)
    ranked = sorted(range(ENTRIES_PER_CATEGORY), key=lambda i: hashlib.sha256(f"{_SPLIT_SALT}{i}".encode()).hexdigest())
    return frozenset(ranked[:n_eval])


def split_of(entry_id: str) -> str:
    """``"eval"`` or ``"train"`` for an entry id (same answer in every category)."""
    return "eval" if scenario_index(entry_id) in eval_indices() else "train"


@functools.lru_cache(maxsize=None)
def class_function_docs(class_name: str) -> tuple[dict, ...]:
    """The function docs of one backend class, as shipped (BFCL's own JSON schema dialect)."""
    _, backend = _bfcl_constants()
    if class_name not in backend.MULTI_TURN_FUNC_DOC_FILE_MAPPING:
        raise KeyError(f"no function docs for class {class_name!r}")
    return tuple(_read_jsonl(data_dir() / "multi_turn_func_doc" / backend.MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


def function_docs(entry: dict) -> tuple[list[dict], dict[int, list[dict]]]:
    """(docs shown at the start, docs revealed per holdout turn), as BFCL builds them.

    Mirrors ``bfcl_eval.utils.populate_test_cases_with_predefined_functions``: the docs
    of every involved class in order; for miss_func entries each held-out function is
    removed from the start list and revealed at its turn. (The data's
    ``excluded_function`` field is not used by bfcl-eval, so it is not used here.) An
    entry with a ``functions`` list (a :func:`single_call_task`) shows only those.
    """
    docs = [dict(d) for name in entry["involved_classes"] for d in class_function_docs(name)]
    if entry.get("functions") is not None:
        shown = set(entry["functions"])
        docs = [d for d in docs if d["name"] in shown]
    revealed: dict[int, list[dict]] = {}
    for turn, names in (entry.get("missed_function") or {}).items():
        revealed[int(turn)] = []
        for name in names:
            for i, doc in enumerate(docs):
                if doc["name"] == name:
                    revealed[int(turn)].append(docs.pop(i))
                    break
    return docs, revealed


# --- prompts ------------------------------------------------------------------------


def bfcl_system_prompt(docs: Sequence[dict]) -> str:
    """BFCL's default prompting system prompt (python calls, JSON docs, plaintext, classic).

    Same text as ``bfcl_eval.model_handler.utils.formulate_system_prompt`` with
    ``DEFAULT_SYSTEM_PROMPT_FORMAT``; rebuilt from ``bfcl_eval.constants`` because that
    module imports tree-sitter parsers the env does not need (a test checks equality).
    """
    p, _ = _bfcl_constants()
    style = p.PROMPT_STYLE_TEMPLATES["classic"]
    tool_call_format = style["tool_call_no_tag"].format(
        output_format=p.OUTPUT_FORMAT_MAPPING["python"], param_types=p.PARAM_TYPE_MAPPING["python"]
    )
    available = style["available_tools"].format(format="json", functions=json.dumps(list(docs), indent=4))
    return p.PROMPT_TEMPLATE_MAPPING["plaintext"].format(
        persona=style["persona"],
        task=style["task"],
        tool_call_format=tool_call_format,
        multiturn_behavior=style["multiturn_behavior"],
        available_tools=available,
    )


def tool_call_system_prompt(docs: Sequence[dict]) -> str:
    """The tools block Qwen's chat template renders (as in bfcl-eval's ``QwenFCHandler``)."""
    text = (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    )
    for doc in docs:
        text += "\n" + json.dumps(doc)
    text += (
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
        '"arguments": <args-json-object>}\n</tool_call>'
    )
    return text


#: The example value of each BFCL parameter type in :func:`example_call`.
EXAMPLE_VALUES = {"string": "example", "integer": 1, "float": 1.0, "boolean": True, "array": ["example"],
                  "dict": {}, "tuple": ["example"], "any": "example"}


def example_call(doc: dict) -> tuple[str, dict[str, Any]]:
    """A call of the function ``doc`` describes, built from its schema alone: each required
    parameter set to the example value of its type (:data:`EXAMPLE_VALUES`). Returns
    ``(name, kwargs)`` for :func:`environments.bfcl.parsing.render_action`."""
    params = doc.get("parameters") or {}
    props = params.get("properties") or {}
    return doc["name"], {k: EXAMPLE_VALUES.get(props.get(k, {}).get("type"), "example")
                         for k in params.get("required") or ()}


def holdout_user_prompt(docs: Sequence[dict]) -> str:
    """The user message of a miss_func holdout turn (BFCL's prompting-mode text)."""
    p, _ = _bfcl_constants()
    return p.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=list(docs))


def openai_tools(docs: Sequence[dict]) -> list[dict]:
    """Function docs as OpenAI-style tool schemas, for chat templates (``tools=``).

    BFCL's dialect (``dict``/``float``/``tuple``/``any``) is mapped to JSON-schema types
    with bfcl-eval's ``GORILLA_TO_OPENAPI`` table, as its ``convert_to_tool`` does.
    """
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    def cast(schema: Any) -> Any:
        if isinstance(schema, dict):
            out = {k: cast(v) for k, v in schema.items() if k != "response"}
            if isinstance(out.get("type"), str):
                out["type"] = GORILLA_TO_OPENAPI.get(out["type"], out["type"])
            if "properties" in out and isinstance(out["properties"], dict):
                out["properties"] = {k: cast(v) for k, v in out["properties"].items()}
            return out
        if isinstance(schema, list):
            return [cast(v) for v in schema]
        return schema

    tools = []
    for doc in docs:
        params = cast(json.loads(json.dumps(doc.get("parameters", {"type": "dict", "properties": {}}))))
        params["type"] = "object"
        tools.append({"type": "function", "function": {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}})
    return tools


# --- tasks --------------------------------------------------------------------------


def entry_to_task(entry: dict) -> Task:
    """A :class:`Task` carrying everything the env needs (no reference back to the file).

    ``prompt`` is the first user turn; ``answer`` the ground-truth call strings per turn;
    ``metadata`` holds ``category``, ``question``, ``initial_config``,
    ``involved_classes``, ``missed_function`` and ``split``.
    """
    first = entry["question"][0] if entry["question"] else []
    prompt = "\n\n".join(m["content"] for m in first if m.get("role") == "user")
    return Task(
        id=entry["id"],
        prompt=prompt,
        answer=[list(turn) for turn in entry["ground_truth"]],
        source="bfcl",
        metadata={
            "category": category_of(entry["id"]),
            "question": entry["question"],
            "initial_config": entry["initial_config"],
            "involved_classes": list(entry["involved_classes"]),
            "missed_function": dict(entry.get("missed_function") or {}),
            "split": split_of(entry["id"]),
        },
    )


@functools.lru_cache(maxsize=None)
def _tasks(category: str) -> tuple[Task, ...]:
    return tuple(entry_to_task(e) for e in load_entries(category))


def load_tasks(category: str, split: str = "all") -> list[Task]:
    """Tasks of one category, in file order; ``split`` is ``all``, ``train`` or ``eval``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    tasks = _tasks(check_category(category))
    return [t for t in tasks if split == "all" or t.metadata["split"] == split]


def load_task(task_id: str) -> Task:
    """The task for an entry id (any category), or for a single-call task's id
    (:data:`SINGLE_CALL_ID`)."""
    if "/" in task_id:
        entry_id, _, rest = task_id.partition("/")
        functions = rest.removeprefix("single_call/f")
        made = (single_call_task(load_task(entry_id), int(functions))
                if rest.startswith("single_call/f") and functions.isdigit() else None)
        if made is None:
            raise KeyError(f"unknown BFCL task id {task_id!r}: expected an entry id or "
                           f"{SINGLE_CALL_ID.format(entry='<entry id>', functions='<n>')} of an entry whose first "
                           "turn is one call")
        return made
    get_entry(task_id)  # raises a clear KeyError for unknown ids
    for task in _tasks(category_of(task_id)):
        if task.id == task_id:
            return task
    raise KeyError(task_id)  # unreachable


_TASK_METADATA = ("question", "initial_config", "involved_classes")


def validate_task(task: Task) -> Task:
    """Check that a (possibly hand-made) task carries what the env needs; returns it.

    Needs ``metadata["question"]`` (turns of message dicts), ``metadata["initial_config"]``,
    ``metadata["involved_classes"]`` (backend class names), a ``category`` in metadata or
    in the id, and ``answer``: one list of ground-truth call strings per turn.
    """
    missing = [k for k in _TASK_METADATA if k not in task.metadata]
    if missing:
        raise ValueError(f"BFCL task {task.id!r} has no metadata {missing}; build tasks with entry_to_task or load_task")
    turns, answer = task.metadata["question"], task.answer
    if not (isinstance(answer, list) and len(answer) == len(turns) and len(turns) > 0
            and all(isinstance(t, list) and all(isinstance(c, str) for c in t) for t in answer)):
        raise ValueError(f"BFCL task {task.id!r}: answer must be one list of call strings per turn ({len(turns)} turns)")
    unknown = [c for c in task.metadata["involved_classes"] if c not in BACKEND_CLASSES]
    if unknown:
        raise ValueError(f"BFCL task {task.id!r}: unknown backend classes {unknown}; expected some of {BACKEND_CLASSES}")
    shown = task.metadata.get("functions")
    if shown is not None and (not isinstance(shown, list) or not shown or not all(isinstance(n, str) for n in shown)):
        raise ValueError(f"BFCL task {task.id!r}: metadata['functions'] must be a non-empty list of function names, "
                         f"got {shown!r:.200}")
    task_category(task)
    return task


def task_category(task: Task) -> str:
    """The task's category: ``metadata["category"]``, else the id's ``<category>_<i>`` prefix."""
    category = task.metadata.get("category") or task.id.rsplit("_", 1)[0]
    return check_category(category)


def task_entry(task: Task) -> dict:
    """The entry dict (BFCL field names) behind a task, built from its metadata."""
    meta = task.metadata
    return {
        "id": task.id,
        "question": meta["question"],
        "initial_config": meta["initial_config"],
        "involved_classes": list(meta["involved_classes"]),
        "missed_function": dict(meta.get("missed_function") or {}),
        "ground_truth": task.answer,
        **({"functions": list(meta["functions"])} if meta.get("functions") is not None else {}),
    }


# --- the single-call tier ------------------------------------------------------------

#: Task tiers of the family (:func:`sample_tasks`): the BFCL entries themselves, or the
#: easiest honest tier, one user turn whose ground truth is a single call.
TIERS = ("multi_turn", "single_call")
#: The id of a single-call task: the entry's id, the tier, the functions shown
#: (``multi_turn_base_12/single_call/f1``); :func:`load_task` reads it back.
SINGLE_CALL_ID = "{entry}/single_call/f{functions}"


def single_call_task(task: Task, functions: int = 1) -> Task | None:
    """The first user turn of a BFCL entry as a task of its own, when that turn's ground
    truth is exactly one call (``None`` otherwise).

    Same scenario (initial state, involved classes), same checker: the env runs the
    official turn checks on that one turn (state equality with the ground-truth run, the
    ground-truth result among the model's results), so its reward is 1 exactly when BFCL
    would pass that turn. ``functions`` is how many function docs the prompt shows: the
    needed function plus ``functions - 1`` others of the involved classes (a fixed draw
    per entry, kept in doc order); 0 shows every function of the involved classes, as
    the entry does. ``metadata["functions"]`` lists the names shown.
    """
    if functions < 0:
        raise ValueError(f"functions must be >= 0 (0: every function of the involved classes), got {functions!r}")
    if len(task.answer[0]) != 1:
        return None
    entry = task_entry(task)
    docs = [d["name"] for d in function_docs(entry)[0]]
    needed = task.answer[0][0].split("(", 1)[0].strip()
    if needed not in docs:
        return None  # the turn's function is held out at the start (miss_func)
    if functions:
        import numpy as np

        others = [name for name in docs if name != needed]
        seed = int(hashlib.sha256(f"bfcl-single-call/{task.id}".encode()).hexdigest()[:16], 16)
        picked = {needed, *np.random.default_rng(seed).permutation(others)[: functions - 1].tolist()}
        docs = [name for name in docs if name in picked]
    meta = task.metadata
    return Task(id=SINGLE_CALL_ID.format(entry=task.id, functions=functions), prompt=task.prompt, answer=[list(task.answer[0])], source="bfcl",
                metadata={**meta, "question": [meta["question"][0]], "missed_function": {}, "functions": docs,
                          "tier": "single_call"})


def single_call_tasks(category: str = "multi_turn_base", split: str = "train", functions: int = 1) -> list[Task]:
    """Every :func:`single_call_task` of one category and split, in file order (98 of the
    200 ``multi_turn_base`` entries; 78 in ``train``)."""
    made = (single_call_task(t, functions) for t in load_tasks(category, split))
    return [t for t in made if t is not None]


def sample_tasks(n: int, seed: int = 0, category: str = "multi_turn_base", split: str = "train",
                 tier: str = "multi_turn", functions: int = 1) -> list[Task]:
    """``n`` distinct tasks of one category, split and tier (:data:`TIERS`), drawn without
    replacement with a seeded permutation (the benches' candidate pools). ``functions``
    applies to the ``single_call`` tier (:func:`single_call_task`)."""
    import numpy as np

    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
    tasks = load_tasks(category, split) if tier == "multi_turn" else single_call_tasks(category, split, functions)
    if not 0 <= n <= len(tasks):
        raise ValueError(f"n must be in [0, {len(tasks)}] for {category}/{split} ({tier} tier), got {n}")
    order = np.random.default_rng(seed).permutation(len(tasks))[:n]
    return [tasks[i] for i in order]
