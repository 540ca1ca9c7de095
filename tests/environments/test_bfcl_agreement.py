"""The env's reward against bfcl-eval's own pipeline on the same model outputs.

The official side is bfcl-eval's code, not a re-implementation: its decoders
(``default_decode_execute_prompting``; ``QwenFCHandler.decode_execute``), its inference
loop's turn rule (a response that fails to decode or decodes to nothing ends the turn;
force-quit past ``MAXIMUM_STEP_LIMIT``), the force-termination and decode-skipping of
``_evaluate_single_multi_turn_entry``, and ``multi_turn_checker``. Only the loop and that
evaluator wrapper are restated here (they live in classes that need API clients); the
decoding, execution and checking are bfcl-eval's functions.

Importing bfcl-eval's decoders needs ``tenacity`` (pure Python); its Java/JavaScript
tree-sitter parsers are stubbed (never used for Python calls). The official executor
``eval``s model output: only run it on the benign perturbations generated here.

Default run: ground-truth replay on all 800 entries and 50 perturbed trajectories per
category. ``-m slow``: 200+ per category, both action formats. Numbers print with ``-s``.
"""

from __future__ import annotations

import copy
import importlib
import itertools
import re
import sys
import types
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("bfcl_eval")
pytest.importorskip("tenacity")

from environments.bfcl import data  # noqa: E402
from environments.bfcl.checker import new_instances, state_differences  # noqa: E402
from environments.bfcl.env import END_TURN, BFCLEnv  # noqa: E402
from environments.bfcl.executor import execute, keyword_form, method_table  # noqa: E402
from environments.bfcl.parsing import render_action  # noqa: E402


# --- bfcl-eval's own pipeline ------------------------------------------------------------


def _stub(name: str, **attrs) -> list[str]:
    """Put a stand-in for ``name`` in sys.modules if it cannot be imported; returns what was added."""
    try:
        importlib.import_module(name)
        return []
    except ImportError:
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
        return [name]


def _unstub(names: list[str]) -> None:
    """Take the stand-ins out again (the importing module keeps its references)."""
    for name in names:
        sys.modules.pop(name, None)


def _unavailable(*_a, **_k):
    raise RuntimeError("stubbed: tree-sitter parsers are not installed")


class Official:
    """bfcl-eval's decoders, inference-loop turn rule and multi_turn_checker."""

    def __init__(self) -> None:
        stubs = _stub("bfcl_eval.model_handler.parser.java_parser", parse_java_function_call=_unavailable)
        stubs += _stub("bfcl_eval.model_handler.parser.js_parser", parse_javascript_function_call=_unavailable)
        from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
        from bfcl_eval.model_handler import utils as handler_utils

        _unstub(stubs)

        self.max_steps = MAXIMUM_STEP_LIMIT
        self.utils = multi_turn_utils
        self.checker = multi_turn_checker
        self.handler_utils = handler_utils
        self._qwen = None
        self._counter = itertools.count()

    def qwen_decode(self, text: str) -> list[str]:
        if self._qwen is None:
            stubs = _stub("overrides", override=lambda f: f, final=lambda f: f, EnforceOverrides=object)
            stubs += _stub("bfcl_eval.model_handler.local_inference.base_oss_handler", OSSHandler=object)
            from bfcl_eval.model_handler.local_inference.qwen_fc import QwenFCHandler

            _unstub(stubs + (["bfcl_eval.model_handler.local_inference.qwen_fc"] if stubs else []))
            self._qwen = object.__new__(QwenFCHandler)
        return self._qwen.decode_execute(text, has_tool_call_tag=False)

    def decode(self, text: str, action_format: str) -> list[str]:
        if action_format == "python":
            return self.handler_utils.default_decode_execute_prompting(text, has_tool_call_tag=False)
        return self.qwen_decode(text)

    def _decodes_to_calls(self, text: str, action_format: str) -> list[str] | None:
        try:
            decoded = self.decode(text, action_format)
        except Exception:
            return None
        return None if self.utils.is_empty_execute_response(decoded) else decoded

    def grade(self, entry: dict, actions: list[str], action_format: str = "python") -> tuple[bool, str | None]:
        """(valid, error_type) of bfcl-eval's evaluation of these responses."""
        n_turns = len(entry["question"])
        stream = iter(actions)
        turns: list[list[str]] = []
        force_quit = False
        for _ in range(n_turns):  # BFCL's inference loop: which responses belong to which turn
            responses, count = [], 0
            while True:
                text = next(stream, END_TURN)
                responses.append(text)
                if self._decodes_to_calls(text, action_format) is None:
                    break
                count += 1
                if count > self.max_steps:
                    force_quit = True
                    break
            turns.append(responses)
            if force_quit:
                break
        if len(turns) != len(entry["ground_truth"]):  # _evaluate_single_multi_turn_entry
            return False, "multi_turn:force_terminated"
        decoded_turns = [
            [d for d in (self._decodes_to_calls(t, action_format) for t in responses) if d is not None]
            for responses in turns
        ]
        model_name = f"trace_gym_agreement_{next(self._counter)}"
        test_entry = {k: copy.deepcopy(entry[k]) for k in ("id", "initial_config", "involved_classes")}
        try:
            result = self.checker(decoded_turns, entry["ground_truth"], test_entry, entry["id"].rsplit("_", 1)[0], model_name)
        finally:
            prefix = re.sub(r"[-./:]", "_", model_name)
            for key in [k for k in vars(self.utils) if k.startswith(prefix)]:
                del vars(self.utils)[key]
        return bool(result["valid"]), result.get("error_type")


@pytest.fixture(scope="module")
def official() -> Official:
    return Official()


def env_grade(env: BFCLEnv, task_id: str, actions: list[str]) -> tuple[float, dict]:
    env.reset(options={"task_id": task_id})
    stream = iter(actions)
    while True:
        _, reward, terminated, truncated, info = env.step(next(stream, END_TURN))
        if terminated or truncated:
            return reward, info


# --- perturbations ----------------------------------------------------------------------

KINDS = ("drop_call", "change_arg", "extra_call", "swap_turns", "split_steps", "positional",
         "duplicate_call", "chatter_mid_turn", "readonly_extra", "identity", "reverse_turn",
         "unknown_call", "empty_list_mid_turn", "destructive_call")


def _turn_calls(entry: dict, table: dict) -> list[list[tuple[str, dict]]]:
    return [[keyword_form(table, text) for text in turn] for turn in entry["ground_truth"]]


def _changed(value, rng):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + int(rng.integers(1, 5))
    if isinstance(value, float):
        return round(value * 1.5 + 1.0, 2)
    if isinstance(value, str):
        return value + "_x" if rng.random() < 0.5 else value.upper() + "2"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {k: _changed(v, rng) for k, v in value.items()}
    return value


def _state_changing_call(entry: dict, table: dict, pool: list, rng: np.random.Generator):
    """A call from ``pool`` that changes this entry's initial backend state, if one is found."""
    task = data.entry_to_task(entry)
    fresh = new_instances(task)
    own = [c for c in pool if c[0] in table]
    for i in rng.permutation(len(own))[:40]:
        name, kwargs = own[int(i)]
        trial = new_instances(task)
        execute(trial, table, name, (), kwargs)
        if state_differences(trial, fresh)[0] is not None:
            return name, kwargs
    return None


def perturb(entry: dict, kind: str, rng: np.random.Generator, pool: list[tuple[str, dict]], action_format: str) -> list[str]:
    """Responses for one perturbed trajectory of ``entry`` (deterministic in ``rng``)."""
    table = method_table(new_instances(data.entry_to_task(entry)))
    turns = _turn_calls(entry, table)
    busy = [i for i, t in enumerate(turns) if t]
    t = int(rng.choice(busy)) if busy else 0
    if kind == "drop_call" and busy:
        turns[t].pop(int(rng.integers(len(turns[t]))))
    elif kind == "change_arg" and busy:
        with_args = [(i, j) for i, turn in enumerate(turns) for j, (_, kw) in enumerate(turn) if kw]
        if with_args:
            i, j = with_args[int(rng.integers(len(with_args)))]
            name, kw = turns[i][j]
            key = list(kw)[int(rng.integers(len(kw)))]
            turns[i][j] = (name, {**kw, key: _changed(kw[key], rng)})
    elif kind == "extra_call" and pool:
        own = [c for c in pool if c[0] in table]
        call = own[int(rng.integers(len(own)))] if own else pool[0]
        turns[t].insert(int(rng.integers(len(turns[t]) + 1)), call)
    elif kind == "swap_turns" and len(turns) > 1:
        i = int(rng.integers(len(turns) - 1))
        turns[i], turns[i + 1] = turns[i + 1], turns[i]
    elif kind == "duplicate_call" and busy:
        j = int(rng.integers(len(turns[t])))
        turns[t].insert(j, turns[t][j])
    elif kind == "reverse_turn" and busy:
        turns[t].reverse()
    elif kind == "destructive_call":
        junk = _state_changing_call(entry, table, pool, rng)
        if junk is not None:
            turns[t].insert(int(rng.integers(len(turns[t]) + 1)), junk)
    elif kind == "unknown_call":
        turns[t].insert(0, ("delete_everything", {"confirm": True}))
    elif kind == "readonly_extra":
        readonly = [n for n in ("ls", "pwd", "get_current_time", "list_all_airports", "get_watchlist", "display_car_status") if n in table]
        if readonly:
            name = readonly[int(rng.integers(len(readonly)))]
            turns[t].insert(0, (name, {"option": "fuel"} if name == "display_car_status" else {}))
    actions: list[str] = []
    for i, turn in enumerate(turns):
        if kind == "positional":
            raw = entry["ground_truth"][i] if i < len(entry["ground_truth"]) else []
            if raw:
                actions.append("[" + ", ".join(raw) + "]")
        elif kind == "split_steps":
            actions.extend(render_action([c], action_format) for c in turn)
        elif kind in ("chatter_mid_turn", "empty_list_mid_turn") and i == t and len(turn) > 1:
            cut = int(rng.integers(1, len(turn)))
            interruption = "Let me check." if kind == "chatter_mid_turn" else ("[]" if action_format == "python" else "")
            actions += [render_action(turn[:cut], action_format), interruption, render_action(turn[cut:], action_format)]
        elif turn:
            actions.append(render_action(turn, action_format))
        actions.append(END_TURN)
    return actions


def call_pool(category: str) -> list[tuple[str, dict]]:
    pool = []
    for entry in data.load_entries(category):
        table = method_table(new_instances(data.entry_to_task(entry)))
        for turn in entry["ground_truth"]:
            pool.extend(keyword_form(table, text) for text in turn)
    return pool


def run_agreement(official: Official, category: str, per_entry: int, entries: int, action_format: str, seed: int = 0):
    rng = np.random.default_rng(seed + data.CATEGORIES.index(category))
    env = BFCLEnv(category=category, action_format=action_format)
    pool = call_pool(category)
    stats: Counter = Counter()
    disagreements = []
    for entry in data.load_entries(category)[:entries]:
        for _ in range(per_entry):
            kind = KINDS[int(rng.integers(len(KINDS)))]
            if action_format == "tool_call" and kind == "positional":
                kind = "identity"
            actions = perturb(entry, kind, rng, pool, action_format)
            reward, info = env_grade(env, entry["id"], actions)
            valid, error_type = official.grade(entry, actions, action_format)
            stats["total"] += 1
            stats["accepted" if valid else "rejected"] += 1
            stats[f"{kind}:{'accepted' if valid else 'rejected'}"] += 1
            if (reward == 1.0) != valid:
                disagreements.append((entry["id"], kind, reward, valid, error_type, info.get("failure")))
            elif not valid and (info["failure"] or {}).get("check") != error_type:
                disagreements.append((entry["id"], kind, "same verdict, different check", error_type, info["failure"]))
    return stats, disagreements


# --- tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_ground_truth_replay_scores_one_where_official_accepts(official, category):
    env = BFCLEnv(category=category)
    counts = Counter()
    for entry in data.load_entries(category):
        actions = env.reference_actions(entry["id"])
        reward, info = env_grade(env, entry["id"], actions)
        valid, error_type = official.grade(entry, actions)
        counts["entries"] += 1
        counts["env_reward_1"] += reward == 1.0
        counts["official_accepts"] += valid
        assert (reward == 1.0) == valid, (entry["id"], info.get("failure"), error_type)
    print(f"\n{category}: ground-truth replay {dict(counts)}")
    assert counts["env_reward_1"] == counts["entries"]


def test_official_rejects_raw_ground_truth_with_positional_args(official):
    """bfcl-eval's decoder drops positional arguments, so `sort('f.pdf')` as model output fails
    there; the env mirrors it (reference_actions name them instead)."""
    entry = data.get_entry("multi_turn_base_0")
    raw = [a for turn in entry["ground_truth"] for a in (["[" + ", ".join(turn) + "]"] if turn else []) + [END_TURN]]
    env = BFCLEnv()
    reward, info = env_grade(env, entry["id"], raw)
    valid, error_type = official.grade(entry, raw)
    assert reward == 0.0 and not valid
    assert info["failure"]["check"] == error_type


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_perturbation_agreement_subset(official, category):
    stats, disagreements = run_agreement(official, category, per_entry=1, entries=50, action_format="python")
    print(f"\n{category}: total {stats['total']}, accepted {stats['accepted']}, rejected {stats['rejected']}")
    assert not disagreements, disagreements[:5]
    assert stats["accepted"] > 0 and stats["rejected"] > 0


@pytest.mark.parametrize("action_format", ["python", "tool_call"])
@pytest.mark.parametrize("category", data.CATEGORIES)
def test_perturbation_agreement_full(official, category, action_format):
    per_entry = 2 if action_format == "python" else 1
    stats, disagreements = run_agreement(official, category, per_entry=per_entry, entries=200, action_format=action_format, seed=7)
    print(f"\n{category} [{action_format}]: total {stats['total']}, accepted {stats['accepted']}, "
          f"rejected {stats['rejected']}, disagreements {len(disagreements)}")
    print("  by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items()) if ":" in k))
    assert stats["total"] >= 200
    assert not disagreements, disagreements[:5]
    assert stats["accepted"] > 0 and stats["rejected"] > 0


def test_decoded_call_text_matches_bfcl_decoder(official):
    """The env's decoded call strings are bfcl-eval's, character for character."""
    from environments.bfcl.parsing import decode

    samples = [
        "[cd(folder='document'), ls(a=True)]",
        "cd(folder=document)",
        "```\n[mv(source='a.txt', destination='b')]\n```",
        "[sort('final_report.pdf')]",
        "[edit_ticket(ticket_id=1, updates={'status': 'Urgent', 'priority': 5})]",
        "[add(a=-3, b=+2.5)]",
        "[f(y=a[0], z=...)]",
        "[f(x=(1, 2), y=[1, [2, {'k': None}]], z=b'q')]",
        "[post_tweet(content='hi', tags=['#a'], mentions=[])]",
    ]
    samples += [  # bfcl-eval quirks, refusals (same text, not run) and decode failures
        "[f(a=+5, b=-2, c=~3)]", "[f(d={1: 'a', 'k': [1, 2]})]", "[cd(folder=pwd())]", "[cd(folder=ls(a=True))]",
        "[f(d={'g': {'x': 1}})]", "[os.path.join(a='x')]", "[f(a=2*3+1, b='ab'+'c', c=7//2, d=2**10)]",
        "[f(a=1/0)]", "[f(a=x+1)]", "[ls(a=lambda: 1)]", "[ls(a=[i for i in range(3)])]", "[ls(a=f'{x}')]",
        "[f(d={})]", "[ls(a=not x)]", "[ls(a=x.y)]", "[ls(a={1, 2})]", "[ls(a=1 if x else 2)]", "ls(", "[ls(), 3]",
        "I will do that now.", "[]", "'[ls()]'", "\t[ls()]",
    ]
    for text in samples:
        mine = [c.text for c in decode(text, "python").calls]
        try:
            theirs = official.decode(text, "python")
        except Exception:
            theirs = []  # bfcl-eval cannot decode it: no calls, the turn ends
        assert mine == theirs, text
    tool = '<tool_call>\n{"name": "cd", "arguments": {"folder": "x"}}\n</tool_call>\n<tool_call>\n{"name": "ls", "arguments": "{\\"a\\": true}"}\n</tool_call>'
    assert [c.text for c in decode(tool, "tool_call").calls] == official.decode(tool, "tool_call")


def test_system_prompt_matches_bfcl(official):
    from bfcl_eval.constants.default_prompts import DEFAULT_SYSTEM_PROMPT_FORMAT

    entry = data.get_entry("multi_turn_miss_func_3")
    docs, _ = data.function_docs(entry)
    assert data.bfcl_system_prompt(docs) == official.handler_utils.formulate_system_prompt(DEFAULT_SYSTEM_PROMPT_FORMAT, docs)
