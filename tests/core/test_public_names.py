"""Public names stay (issue 42): every ``trace_gym`` name the docs show imports, and each module
path that stood in ``trace_gym/`` before the wings fails in one line naming its new home.

The old paths raise rather than re-export: a re-export would keep two names for one module
alive, and the wings exist so that a newcomer finds one (``trace_gym/__init__.py``, ``MOVED``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trace_gym
from trace_gym.registry import ENTRY_POINT_GROUP, STRATEGIES_GROUP, TASKS_GROUP
from trace_gym.train.advantages import ENTRY_POINT_GROUP as ESTIMATORS_GROUP

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
#: ``from trace_gym[.x] import a, b`` in a page, on one line or in parentheses over several.
FROM_IMPORT = re.compile(r"from (trace_gym(?:\.\w+)*) import (\([^)]*\)|[\w ,]+)")
#: A dotted name in backticks: ``trace_gym.x.y``.
DOTTED = re.compile(r"`(trace_gym(?:\.\w+)+)`")
#: Dotted names the docs show that are entry-point groups, not modules.
GROUPS = {ENTRY_POINT_GROUP, TASKS_GROUP, STRATEGIES_GROUP, ESTIMATORS_GROUP}


def shown_names(text: str) -> set[str]:
    """Every ``module:name`` a page imports and every dotted ``trace_gym.x.y`` it names."""
    found = {f"{m}:{n.strip()}" for m, names in FROM_IMPORT.findall(text)
             for n in names.strip("()").replace("\n", " ").split(",") if n.strip()}
    return found | {d for d in DOTTED.findall(text) if d not in GROUPS}


def resolves(name: str) -> bool:
    """Whether ``module:attr`` imports, or ``a.b.c`` is a module or a name inside the longest
    module prefix of it."""
    module, _, attr = name.partition(":")
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in [*parts[cut:], *([attr] if attr else [])]:
            try:
                obj = getattr(obj, part)
            except (AttributeError, ImportError):
                return False
        return True
    return False


def test_the_parser_finds_both_forms_and_a_wrong_name_fails():
    text = ("```python\nfrom trace_gym.api import (\n    check_env,\n    resolve_env,\n)\n```\n"
            "see `trace_gym.step.driver.run_step` and `trace_gym.envs`; `trace_gym.driver.run_step` is gone")
    names = shown_names(text)
    assert names == {"trace_gym.api:check_env", "trace_gym.api:resolve_env", "trace_gym.step.driver.run_step",
                     "trace_gym.driver.run_step"}
    assert [n for n in sorted(names) if not resolves(n)] == ["trace_gym.driver.run_step"]


def test_every_name_the_docs_show_imports():
    shown = {(name, page.relative_to(ROOT).as_posix()) for page in PAGES for name in shown_names(page.read_text())}
    assert len({n for n, _ in shown if n.startswith("trace_gym.api:")}) >= 20  # the docs show the public API
    assert sorted(f"{page}: {name}" for name, page in shown if not resolves(name)) == []


def test_every_name_of_trace_gym_api_imports():
    import trace_gym.api as api

    assert api.__all__ and [n for n in api.__all__ if not hasattr(api, n)] == []


@pytest.mark.parametrize("old", sorted(trace_gym.MOVED))
def test_an_old_module_path_names_its_new_home(old):
    home = trace_gym.MOVED[old]
    if old.replace(".", "/") in {p.relative_to(ROOT).as_posix() for p in (ROOT / "trace_gym").iterdir() if p.is_dir()}:
        # a module that became a wing of the same name: the wing imports; a name of the old module names its home
        wing = importlib.import_module(old)
        name = next(n for n in dir(importlib.import_module(home)) if not n.startswith("_")
                    and importlib.util.find_spec(f"{old}.{n}") is None)
        with pytest.raises(ImportError, match=rf"^{re.escape(old)}\.{name} moved: from {re.escape(home)} import"):
            getattr(wing, name)
        return
    with pytest.raises(ModuleNotFoundError, match=rf"^{re.escape(old)} moved to {re.escape(home)} "):
        importlib.import_module(old)


def test_every_home_imports():
    for home in trace_gym.MOVED.values():
        for module in re.findall(r"trace_gym(?:\.\w+)+", home):
            importlib.import_module(module)


def test_an_old_path_fails_in_a_fresh_process_before_the_editable_finder():
    out = subprocess.run([sys.executable, "-c", "import trace_gym.bench_bank"], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "ModuleNotFoundError: trace_gym.bench_bank moved to trace_gym.bench.bank (trace_gym's wings)")
