"""The shape the code keeps: no function over 80 lines in the four packages (a function that
long does several things; split it into named helpers, each a step with a name). A function's
length is ``end_lineno - lineno + 1`` of its ``def`` (signature, docstring and body;
decorators not counted), for every function, method and nested function alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trace_gym", "environments", "evaluators", "retrieval_index")
MAX_LINES = 80


def long_functions(source: str, max_lines: int = MAX_LINES) -> dict[str, int]:
    """``{qualified name: lines}`` of the functions in ``source`` longer than ``max_lines``
    (``Class.method`` and ``outer.inner`` for the nested ones)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                lines = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and lines > max_lines:
                    found[name] = lines
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def scan(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, int]:
    """``{"path:qualname": lines}`` of every long function in the ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            found.update({f"{rel}:{name}": n for name, n in long_functions(path.read_text(encoding="utf-8")).items()})
    return found


@pytest.fixture(scope="module")
def found() -> dict[str, int]:
    return scan(ROOT)


def test_no_function_is_over_80_lines(found):
    assert found == {}, f"functions over {MAX_LINES} lines (split them into named helpers): {found}"


def _function(name: str, lines: int, indent: str = "") -> str:
    """The source of a function ``lines`` long (its def line included)."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{indent}    \"\"\"Doc.\"\"\"\n{body}"


def test_the_checker_counts_lines_as_the_rule_says():
    source = (_function("exactly_80", 80) + _function("eighty_one", 81)
              + "class Holder:\n" + _function("method", 90, indent="    ")
              + "def outer():\n" + _function("inner", 85, indent="    ") + "    return inner\n"
              + "async def waits():\n" + "".join(f"    await f{i}()\n" for i in range(81)))
    assert long_functions(source) == {"eighty_one": 81, "Holder.method": 90, "outer": 87, "outer.inner": 85,
                                      "waits": 82}


def test_the_scan_fails_on_a_planted_long_function(tmp_path):
    for package in PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
    (tmp_path / "trace_gym" / "short.py").write_text(_function("fine", MAX_LINES))
    (tmp_path / "evaluators" / "sub" / "long.py").write_text(_function("too_long", MAX_LINES + 1))
    assert scan(tmp_path) == {"evaluators/sub/long.py:too_long": MAX_LINES + 1}
