"""Imports point down: the core of trace_gym/ imports nothing of the face or the families.

Two independent checks: a static scan of every import statement (module level and
inside functions) of every core module, and a fresh interpreter per core module that
imports it alone and looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "trace_gym"
#: The face: the only modules of trace_gym/ that may name everything (api.py is the
#: public API of issue 9, which re-exports the built-in allocators; commands/ holds one
#: module per command of the one parser in cli.py).
FACE = {"cli.py", "registry.py", "strategies.py", "api.py"}
FACE_PACKAGES = ("commands",)
#: Packages outside the core, and the face's modules.
FORBIDDEN_PACKAGES = ("environments", "baselines", "evaluators", "retrieval_index")
FORBIDDEN_MODULES = ("trace_gym.cli", "trace_gym.registry", "trace_gym.strategies", "trace_gym.api",
                     "trace_gym.commands")


def core_modules() -> list[Path]:
    return sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).as_posix() not in FACE
                  and p.relative_to(CORE).parts[0] not in FACE_PACKAGES)


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


def test_the_scan_sees_imports_inside_functions(tmp_path):
    planted = CORE / "_planted_for_scan_test.py"
    planted.write_text("def f():\n    from trace_gym import strategies\n    import baselines.uniform\n")
    try:
        names = [n for _, n in imported_names(planted)]
        assert forbidden("trace_gym.strategies") and "trace_gym.strategies" in names
        assert "baselines.uniform" in names
    finally:
        planted.unlink()


def test_no_core_module_imports_the_face_or_the_families():
    bad = []
    for path in core_modules():
        rel = path.relative_to(ROOT).as_posix()
        for line, name in imported_names(path):
            if not forbidden(name):
                continue
            if rel == "trace_gym/__init__.py" and name.startswith("trace_gym.registry"):
                continue  # the one exception: `import trace_gym` registers the Gymnasium ids
            bad.append(f"{rel}:{line} imports {name}")
    assert not bad, "\n".join(bad)


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
    assert [n for _, n in imported_names(CORE / "sim.py") if n.startswith("trace_gym.sim_predictors")] == []
    assert any(n.startswith("trace_gym.sim") for _, n in imported_names(CORE / "sim_predictors.py"))


def test_predictor_kinds_are_listed_in_one_table():
    """No module but predictor.py holds a list, tuple, set or dict of two or more predictor
    kind names (configs validate against PREDICTORS, help text is generated from it)."""
    from trace_gym.predictor import PREDICTORS

    names = set(PREDICTORS)
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "predictor.py":
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
    planted = CORE / "suggest.py"
    source = planted.read_text()
    try:
        planted.write_text(source + "\n\ndef _planted():\n    from trace_gym import config\n")
        assert ["trace_gym.config", "trace_gym.suggest"] in circles(import_graph())
    finally:
        planted.write_text(source)


def test_the_config_loader_is_a_leaf():
    """config.py imports nothing of trace_gym but leaves: its string helpers, what a field
    declares (config_fields) and the bounded JSON reader (textsafe)."""
    leaves = {"trace_gym.suggest", "trace_gym.config_fields", "trace_gym.textsafe"}
    names = {n for _, n in imported_names(CORE / "config.py") if n.startswith("trace_gym")}
    assert {n if n in leaves else n.rpartition(".")[0] for n in names} <= leaves, names
    graph = import_graph()
    assert all(graph[leaf] == set() for leaf in leaves), {leaf: graph[leaf] for leaf in leaves}


def test_did_you_mean_is_written_once():
    defining = [p.relative_to(ROOT).as_posix() for pkg in ("trace_gym", "environments", "evaluators", "baselines")
                for p in (ROOT / pkg).rglob("*.py") if "def did_you_mean(" in p.read_text()]
    assert defining == ["trace_gym/suggest.py"]
