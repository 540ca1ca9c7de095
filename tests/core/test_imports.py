"""Imports point down, wing by wing: the layering of trace_gym/ as folders, held to the code.

``trace_gym/`` stands in wings (one folder per part) over a few root modules; the face
(``cli.py``, ``commands/``, ``registry.py``, ``strategies.py``, ``api.py``) names everything and
nothing of the rest imports it. :data:`MAY_IMPORT` is the rule: what each wing (or root
module) may import of ``trace_gym``; each wing's ``__init__.py`` says the same in words.

Three independent checks: a static scan of every import statement (module level and inside
functions) of every module against the rule, a fresh interpreter per core module that
imports it alone and looks at ``sys.modules``, and no import circle (module by module, and
wing by wing).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "trace_gym"
#: The face: the only rooms of trace_gym/ that may name everything (api.py is the public
#: API; commands/ holds one module per command of the one parser in cli.py).
FACE = {"cli", "commands", "registry", "strategies", "api"}
#: What each room of trace_gym/ that is not the face may import of trace_gym (a room is a
#: wing, the folder, or a module at the root); its own room always. From the ground up.
MAY_IMPORT: dict[str, set[str]] = {
    # the ground: shared vocabulary and services
    "utils": set(),
    "types": set(),
    "tree": set(),
    "budget": set(),
    "config": {"utils"},
    "models": {"utils"},
    "report": {"tree"},
    # the parts, each below what uses it
    "allocation": {"tree"},
    "env": {"types", "config", "utils"},
    "engines": {"types", "models", "utils"},
    "runs": {"config", "models", "report", "utils"},
    "predictor": {"engines", "models", "report", "utils"},
    "step": {"allocation", "budget", "env", "predictor", "tree"},
    "agent": {"allocation", "budget", "env", "predictor", "step", "tree", "types", "utils"},
    "sim": {"allocation", "budget", "predictor", "step", "tree"},
    "config_sections": {"agent", "budget", "config", "predictor", "step", "utils"},
    "banks": {"agent", "budget", "config", "config_sections", "predictor", "report", "runs", "step", "tree", "types",
              "utils"},
    "bench": {"agent", "allocation", "banks", "budget", "config", "config_sections", "engines", "env", "models",
              "predictor", "report", "runs", "sim", "step", "types", "utils"},
    "train": {"agent", "budget", "config", "config_sections", "engines", "env", "models", "predictor", "report", "runs",
              "step", "tree", "types", "utils"},
}
#: Packages outside the core, and the face's modules.
FORBIDDEN_PACKAGES = ("environments", "baselines", "evaluators", "retrieval_index")
FORBIDDEN_MODULES = tuple(f"trace_gym.{room}" for room in sorted(FACE))
#: At most this many modules stand at the root of trace_gym/ beside its wings (issue 42).
MAX_ROOT_MODULES = 12


def room_of(module: str) -> str:
    """The room of a dotted ``trace_gym.x[.y]`` module: its wing (``x`` of a folder) or root
    module (``x``); ``trace_gym`` itself for the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def core_modules(core: Path = CORE) -> list[Path]:
    return sorted(p for p in core.rglob("*.py") if p.relative_to(core).parts[0].removesuffix(".py") not in FACE)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every module an ``import`` / ``from ... import`` in ``path`` names (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # `from trace_gym import cli`
    return out


def forbidden(name: str) -> bool:
    return name.split(".")[0] in FORBIDDEN_PACKAGES or any(
        name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES)


def rooms() -> set[str]:
    """Every room of trace_gym/: its folders and its root modules (not the package's own ``__init__``)."""
    return {p.name.removesuffix(".py") for p in CORE.iterdir()
            if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")}


def rule_breaks() -> list[str]:
    """``file:line imports module`` for every import of a core module that its room may not
    make: a room :data:`MAY_IMPORT` does not give it, the face, or a package outside the core."""
    bad, known = [], rooms()
    for path in core_modules():
        rel, here = path.relative_to(ROOT).as_posix(), room_of(module_name(path))
        allowed = MAY_IMPORT.get(here, set())
        for line, name in imported_names(path):
            if here == "trace_gym" and name.startswith("trace_gym.registry"):
                continue  # the one exception: `import trace_gym` registers the Gymnasium ids
            there = room_of(name) if name.startswith("trace_gym.") else None
            if forbidden(name) or (there in known and there not in (here, *allowed) and here != "trace_gym"):
                bad.append(f"{rel}:{line} imports {name} ({here} may import {sorted(allowed)})")
    return bad


def test_the_scan_sees_imports_inside_functions(tmp_path):
    planted = CORE / "_planted_for_scan_test.py"
    planted.write_text("def f():\n    from trace_gym import strategies\n    import baselines.uniform\n")
    try:
        names = [n for _, n in imported_names(planted)]
        assert forbidden("trace_gym.strategies") and "trace_gym.strategies" in names
        assert "baselines.uniform" in names
    finally:
        planted.unlink()


def test_every_room_keeps_to_its_rule():
    """Each wing and root module imports only what :data:`MAY_IMPORT` gives it, never the
    face, environments/, baselines/, evaluators/ or retrieval_index/."""
    assert rule_breaks() == []


@pytest.mark.parametrize("planted, line", [
    ("allocation/_planted.py", "from trace_gym.bench.loop import run_bench"),  # a wing reaching up
    ("env/_planted.py", "def f():\n    import trace_gym.registry"),  # a core wing importing the face, lazily
    ("_planted_root.py", "import trace_gym.tree"),  # a root module the rule does not place
])
def test_the_rule_fails_on_a_planted_violation(planted, line):
    path = CORE / planted
    path.write_text(line + "\n")
    try:
        assert [b for b in rule_breaks() if planted in b], planted
    finally:
        path.unlink()


def test_every_room_has_a_rule_and_the_rule_has_no_circle():
    """A new wing or root module is placed in the rule (or the face); the rule itself runs one
    way, so the rooms stand on floors."""
    assert rooms() - FACE == set(MAY_IMPORT), sorted(rooms() - FACE ^ set(MAY_IMPORT))
    assert not FACE & set().union(*MAY_IMPORT.values())
    assert circles({room: set(allowed) for room, allowed in MAY_IMPORT.items()}) == []


def test_each_wing_says_what_it_may_import():
    """Each wing's ``__init__.py`` ends its docstring with ``May import: ...`` naming exactly
    the rooms :data:`MAY_IMPORT` gives it (``nothing of trace_gym`` for none)."""
    wrong = {}
    for wing in sorted(r for r in MAY_IMPORT if (CORE / r).is_dir()):
        doc = ast.get_docstring(ast.parse((CORE / wing / "__init__.py").read_text())) or ""
        said = re.search(r"May import: (.*?)\.?\s*$", doc, re.S)
        names = set(re.findall(r"``(\w+)``", said.group(1))) if said else None
        if names != MAY_IMPORT[wing]:
            wrong[wing] = names
    assert wrong == {}


def face_imports(package: Path) -> list[tuple[Path, int, str]]:
    """``(file, line, module)`` of every import of the face in ``package`` (any depth)."""
    return [(path, line, name) for path in sorted(package.rglob("*.py")) for line, name in imported_names(path)
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES)]


def test_no_environment_imports_the_face():
    """environments/ plugs into the core's contract (``trace_gym.env``), below the face: no
    module of it (the ecosystem adapters included) imports cli, commands, registry,
    strategies or api. A planted adapter that does is reported."""
    shown = lambda found: [f"{p.relative_to(ROOT)}:{line} imports {name}" for p, line, name in found]  # noqa: E731
    assert shown(face_imports(ROOT / "environments")) == []
    planted = ROOT / "environments" / "ecosystems" / "_planted_adapter.py"
    planted.write_text("def family():\n    from trace_gym.registry import adapter_family\n")
    try:
        assert "environments/ecosystems/_planted_adapter.py:2 imports trace_gym.registry" in shown(
            face_imports(ROOT / "environments"))
    finally:
        planted.unlink()


def test_the_root_holds_few_modules():
    root = sorted(p.name for p in CORE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


#: The folders of tests/ that are not a wing of trace_gym/: its root modules and the face
#: (``core``), the other packages (``environments``, its ``ecosystem`` adapters, ``eval``,
#: ``retrieval``), the checks across them (``security``), and what tests share (``fixtures``, ``data``).
TESTS_BESIDE_THE_WINGS = {"core", "environments", "ecosystem", "eval", "retrieval", "security", "fixtures", "data"}


def test_the_tests_mirror_the_wings():
    """tests/ has one folder per wing of trace_gym/ (the face's ``commands`` is tested in ``core``)
    and the folders above beside them, no other."""
    wings = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()} - FACE
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert sorted(folders - TESTS_BESIDE_THE_WINGS) == sorted(wings)


#: One interpreter imports the package (what importing any of its modules does first) and
#: the heavy third-party libraries, then forks a fresh child per core module: the child
#: imports that module alone and reports what it loaded. A forked child sees exactly what a
#: fresh interpreter would (nothing preloaded is a module of the project beyond the package
#: and its id registry), at a fraction of the cost of one interpreter per module.
_FORK_EACH = """
import importlib, json, os, sys, tempfile
import numpy, torch, transformers  # noqa: F401  (third-party: preloaded to share, never the project's)
import trace_gym  # noqa: F401  (what importing any trace_gym.x does first)
modules, folder, running, out = json.loads(sys.argv[1]), tempfile.mkdtemp(), {}, {}
width = max(1, len(os.sched_getaffinity(0)))
for i, module in enumerate(modules):
    while len(running) >= width:
        running.pop(os.wait()[0])
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(module)
            text = json.dumps(sorted(sys.modules))
        except BaseException as exc:  # reported, not raised: the parent goes on
            text = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        with open(os.path.join(folder, str(i)), "w") as f:
            f.write(text)
        os._exit(0)
    running[pid] = module
while running:
    running.pop(os.wait()[0])
for i, module in enumerate(modules):
    path = os.path.join(folder, str(i))
    out[module] = json.load(open(path)) if os.path.exists(path) else {"error": "child died"}
print(json.dumps(out))
"""
CORE_MODULES = [module_name(p) for p in core_modules() if p.name != "__init__.py"]


PLANTED = "trace_gym._planted_face_import"


@pytest.fixture(scope="module")
def loaded_by_each_module() -> dict:
    """What importing each core module alone loads, plus a planted module that imports the face."""
    planted = CORE / "_planted_face_import.py"
    planted.write_text("import trace_gym.cli  # noqa: F401\n")
    try:
        out = subprocess.run([sys.executable, "-c", _FORK_EACH, json.dumps([PLANTED, *CORE_MODULES])], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
    finally:
        planted.unlink()
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", CORE_MODULES)
def test_each_core_module_alone_loads_nothing_of_the_face(module, loaded_by_each_module):
    loaded = loaded_by_each_module[module]
    assert not (isinstance(loaded, dict) and "error" in loaded), f"importing {module}: {loaded}"
    # trace_gym/__init__.py registering the ids is the one allowed use of the registry
    leaked = [m for m in loaded if forbidden(m) and m != "trace_gym.registry"]
    assert not leaked, f"importing {module} loaded {leaked}"


def test_the_forked_import_check_sees_a_leak(loaded_by_each_module):
    """The planted module's child loaded the face; its siblings, forked after it, did not."""
    assert "trace_gym.cli" in loaded_by_each_module[PLANTED]
    assert "trace_gym.cli" not in loaded_by_each_module["trace_gym.types"]


def test_import_trace_gym_registers_ids_without_importing_envs():
    code = (
        "import json, sys, trace_gym\n"
        "from gymnasium.envs.registration import registry\n"
        "ids = sorted(k for k in registry if k.startswith('trace_gym/'))\n"
        "print(json.dumps([ids, sorted(sys.modules)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ids, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"trace_gym/MathPython-v0", "trace_gym/BFCL-v0", "trace_gym/GuessNumber-v0"} <= set(ids)
    assert not [m for m in loaded if m.split(".")[0] in FORBIDDEN_PACKAGES]


def test_the_simulator_and_its_predictors_do_not_import_each_other():
    """sim_predictors imports sim (its states and world); sim never imports sim_predictors."""
    assert [n for _, n in imported_names(CORE / "sim" / "simulator.py") if n.startswith("trace_gym.sim.predictors")] == []
    assert any(n.startswith("trace_gym.sim.simulator") for _, n in imported_names(CORE / "sim" / "predictors.py"))


def test_predictor_kinds_are_listed_in_one_table():
    """No module but predictor.py holds a list, tuple, set or dict of two or more predictor
    kind names (configs validate against PREDICTORS, help text is generated from it)."""
    from trace_gym.predictor.kinds import PREDICTORS

    names = set(PREDICTORS)
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path.relative_to(CORE).as_posix() == "predictor/kinds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                kinds = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
                if len(kinds) >= 2:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(kinds)}")
    assert offenders == []


# ---------------------------------------------------------------------- no import circle
#: every top-level package of the repository (the house)
HOUSE = (CORE, *(ROOT / name for name in FORBIDDEN_PACKAGES))


def import_graph(*roots: Path) -> dict[str, set[str]]:
    """module -> the modules of ``roots`` (default trace_gym/) it imports (module level and
    inside functions); a top-level package itself (``import trace_gym``: its ids) is no edge."""
    roots = roots or (CORE,)
    modules = {module_name(p): p for root in roots for p in sorted(root.rglob("*.py"))}
    tops = {root.name for root in roots}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for _, imported in imported_names(path):
            parts = imported.split(".")
            target = next((".".join(parts[:k]) for k in range(len(parts), 0, -1)
                           if ".".join(parts[:k]) in modules), None)
            if target and target != name and target not in tops:
                graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected components of two or more (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_planted_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_trace_gym():
    """Lazy imports count: an import inside a function that climbs back up is a circle too.
    With no circle the imports define the layers (a module's imports all lie below it)."""
    assert circles(import_graph()) == []


def test_no_import_circle_in_the_whole_house():
    """The same over every package of the repository and between them (environments/,
    evaluators/, retrieval_index/, baselines/ and trace_gym/): a record two modules share
    (``evaluators.suite.Suite``, ``retrieval_index.limits.ServerLimits``,
    ``environments.ecosystems.entry_json``) sits below both."""
    assert circles(import_graph(*HOUSE)) == []


def test_a_planted_lazy_import_back_up_is_a_circle():
    planted = CORE / "utils" / "suggest.py"
    source = planted.read_text()
    try:
        planted.write_text(source + "\n\ndef _planted():\n    from trace_gym import config\n")
        assert ["trace_gym.config", "trace_gym.utils.suggest"] in circles(import_graph())
    finally:
        planted.write_text(source)


def test_the_config_loader_is_a_leaf():
    """config.py imports nothing of trace_gym but leaves: its string helpers, what a field
    declares (config_fields) and the bounded JSON reader (textsafe)."""
    leaves = {"trace_gym.utils.suggest", "trace_gym.utils.config_fields", "trace_gym.utils.textsafe"}
    names = {n for _, n in imported_names(CORE / "config.py") if n.startswith("trace_gym")}
    assert {n if n in leaves else n.rpartition(".")[0] for n in names} <= leaves, names
    graph = import_graph()
    assert all(graph[leaf] == set() for leaf in leaves), {leaf: graph[leaf] for leaf in leaves}


def test_did_you_mean_is_written_once():
    defining = [p.relative_to(ROOT).as_posix() for pkg in ("trace_gym", "environments", "evaluators", "baselines")
                for p in (ROOT / pkg).rglob("*.py") if "def did_you_mean(" in p.read_text()]
    assert defining == ["trace_gym/utils/suggest.py"]
