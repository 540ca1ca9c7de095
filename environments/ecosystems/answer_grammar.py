"""Allow-list grammars for answers that a reasoning-gym scorer evaluates as code.

Some reasoning-gym scorers ``eval`` the answer text (``spiral_matrix``, ``binary_matrix``,
``n_queens``, ``string_insertion``) or hand it to sympy's ``parse_expr`` (``countdown``,
``puzzle24``, the integration datasets, ``polynomial_multiplication``). An evaluated answer
can compute its way to full marks without solving the task (``factorial(4)*1*1*1`` for
puzzle24, ``Integral(<the integrand>, x)`` for an integration, a name that reads the gold
answer from the scorer's frame for n_queens). So, before scoring, the adapter checks the
answer against the grammar of its dataset (:func:`refusal`); an answer outside it scores 0.

The text is NFKC-normalised first (Python reads ``ｅｖａｌ`` as ``eval``): an answer whose
identifiers normalisation changes is refused. Its size is bounded (:data:`MAX_CHARS`)
before it is parsed with :mod:`ast`; a parse that fails with anything but a
``SyntaxError`` is refused. The grammars (:data:`GRAMMARS`, default :data:`LITERAL`):

* :data:`LITERAL` (every evaluating dataset by default): text that is not a Python
  expression passes (``eval`` fails on it too; the datasets' own formats, such as
  ``"1 2 3\\n4 5 6"``, are not Python); a Python expression may hold only literals
  (numbers, strings, bytes, ``True``/``False``/``None``), containers (list, tuple, set,
  dict) and ``+ - * / // %`` and unary ``+ -`` on them: no name, call, attribute,
  subscript, comprehension, lambda, f-string, starred item or ``:=``. Answers of
  :data:`PLAIN_TEXT` datasets that match its pattern pass first: reasoning-gym compares
  them as text before any ``eval``.
* :data:`ARITHMETIC` (``countdown``, ``puzzle24``): the characters ``0-9 + - * / ( )`` and
  blanks, parsed as integer literals, ``+ - * /``, unary minus and parentheses; the
  integers used must be a sub-multiset of the entry's ``metadata["numbers"]``
  (``countdown``; its scorer then asks for all of them) or exactly that multiset
  (``puzzle24``, whose scorer only checks four numbers in range).
* :data:`SYMPY` (the integration datasets, ``polynomial_multiplication``): printable
  ASCII parsed as numbers, symbol names, ``+ - * / **``, unary ``+ -`` and calls, with
  positional arguments only, to the elementary functions :data:`ELEMENTARY`; no strings,
  attributes, subscripts or calls to anything else (``Integral``, ``integrate``,
  ``expand``, ``diff``, ``simplify``, ...). A product left unexpanded needs no rule of ours
  for ``polynomial_multiplication``: its scorer compares sympy expressions structurally
  (``==``), and ``(x + 1)*(x + 2)`` is not ``x**2 + 3*x + 2`` there (tested).

:data:`NOT_EVALUATED` names the datasets whose module reads as evaluating
(``sandboxed_scoring.EVALUATES``) but whose scorer never evaluates the answer
(reasoning-gym 0.1.23): they get no grammar, their formats (JSON with ``true``,
propositional formulas over ``P``, ``Q``) are not Python literals.
"""

from __future__ import annotations

import ast
import re
import unicodedata
from collections import Counter
from typing import Any, Callable, Mapping

#: characters of an answer the grammars parse; a longer answer to an evaluating scorer is refused
MAX_CHARS = 10_000
LITERAL, ARITHMETIC, SYMPY = "literal", "arithmetic", "sympy"
#: the grammar of each dataset whose scorer evaluates answers; any other evaluating dataset gets LITERAL
GRAMMARS = {"countdown": ARITHMETIC, "puzzle24": ARITHMETIC, "simple_integration": SYMPY,
            "intermediate_integration": SYMPY, "polynomial_multiplication": SYMPY}
#: datasets whose module matches EVALUATES though their scorer never evaluates the answer (why)
NOT_EVALUATED = {
    "codeio": "exec() runs the generator's code; answers are compared as text and JSON",
    "propositional_logic": "its parse_expr is its own parser of logic formulas, not Python's",
}
#: answers a scorer compares as text before any eval (the dataset's own answer format)
PLAIN_TEXT = {"string_insertion": re.compile(r"[A-E]+")}
#: the functions a SYMPY answer may call
ELEMENTARY = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                        "exp", "log", "ln", "sqrt", "Abs"})
#: what each grammar allows, for the refusal message
ALLOWED = {
    LITERAL: "literals (numbers, strings, True/False/None), lists, tuples, sets, dicts and + - * / // % on them",
    ARITHMETIC: "integer literals, + - * /, unary minus and parentheses",
    SYMPY: "numbers, symbol names, + - * / **, and calls to " + " ".join(sorted(ELEMENTARY)),
}
_IDENTIFIER = re.compile(r"[^\W\d]\w*")
_ARITHMETIC_CHARS = re.compile(r"[0-9+\-*/() \t\n]*")
_SYMBOL = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_LITERAL_NODES = (ast.Expression, ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Load, ast.UnaryOp,
                  ast.UAdd, ast.USub, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)
_ARITHMETIC_NODES = (ast.Expression, ast.Constant, ast.UnaryOp, ast.USub, ast.BinOp, ast.Add, ast.Sub, ast.Mult,
                     ast.Div)
_SYMPY_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Call, ast.UnaryOp, ast.UAdd, ast.USub,
                ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)


class _Refused(Exception):
    """An answer outside its grammar; the message says which rule it broke."""


def grammar_of(dataset: str, evaluates: bool) -> str | None:
    """The grammar of ``dataset``'s answers, or ``None`` for no check (a scorer that never
    evaluates answer text). ``evaluates``: whether its module reads as evaluating text."""
    if dataset in GRAMMARS:
        return GRAMMARS[dataset]
    if not evaluates or dataset in NOT_EVALUATED:
        return None
    return LITERAL


def describe(node: ast.AST) -> str:
    """``node`` in a few words, for a refusal message (``a call to Integral``)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return f"a call to {name}" if name else "a call"
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Attribute):
        return f"an attribute (.{node.attr})"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r:.40}"
    words = {ast.Subscript: "a subscript", ast.Lambda: "a lambda", ast.JoinedStr: "an f-string",
             ast.Starred: "a starred item", ast.NamedExpr: "an assignment (:=)", ast.ListComp: "a comprehension",
             ast.SetComp: "a comprehension", ast.DictComp: "a comprehension", ast.GeneratorExp: "a comprehension"}
    for kind, word in words.items():
        if isinstance(node, kind):
            return word
    return f"a {type(node).__name__} node"


def parse(text: str) -> ast.Expression | None:
    """``text`` parsed as a Python expression, or ``None`` when it is not one (a
    ``SyntaxError``: ``eval`` would fail on it too).

    Raises:
        _Refused: longer than :data:`MAX_CHARS`, or a parse that failed otherwise
            (recursion, memory, a null byte, an integer too long to convert).
    """
    if len(text) > MAX_CHARS:
        raise _Refused(f"longer than {MAX_CHARS} characters, too long to check")
    try:
        return ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
        raise _Refused(f"it could not be checked ({type(exc).__name__})") from None


def _nodes(tree: ast.AST, allowed: tuple[type, ...], rule: Callable[[ast.AST], None] | None = None) -> list[ast.AST]:
    """Every node of ``tree``, outermost first (iteratively: no recursion), refusing the
    first that is not in ``allowed`` or that ``rule`` refuses."""
    nodes = list(ast.walk(tree))
    for node in nodes:
        if not isinstance(node, allowed):
            raise _Refused(describe(node))
        if rule is not None:
            rule(node)
    return nodes


def check_literal(text: str) -> None:
    """The :data:`LITERAL` grammar (module docstring). Raises ``_Refused``."""
    tree = parse(text)
    if tree is not None:
        _nodes(tree, _LITERAL_NODES)


def _strict_tree(text: str, allowed: tuple[type, ...], rule: Callable[[ast.AST], None] | None = None) -> list[ast.AST]:
    """The nodes of ``text``, which must parse (:func:`_nodes`)."""
    tree = parse(text)
    if tree is None:
        raise _Refused("it is not a Python expression")
    return _nodes(tree, allowed, rule)


def check_arithmetic(text: str, numbers: Any, exact: bool) -> None:
    """The :data:`ARITHMETIC` grammar over the puzzle's ``numbers``: the integers used are
    exactly that multiset (``exact``) or a sub-multiset of it. Raises ``_Refused``."""
    if not _ARITHMETIC_CHARS.fullmatch(text):
        bad = next(c for c in text if not _ARITHMETIC_CHARS.fullmatch(c))
        raise _Refused(f"the character {bad!r}")
    used = []
    for node in _strict_tree(text, _ARITHMETIC_NODES):
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise _Refused(describe(node))
            used.append(node.value)
    if not isinstance(numbers, (list, tuple)) or not all(type(n) is int for n in numbers):
        raise _Refused("the entry holds no numbers to check the answer's against")
    have, given = Counter(used), Counter(numbers)
    if exact and have != given:
        raise _Refused(f"it uses the numbers {sorted(used)}, the puzzle's are {sorted(numbers)} (each exactly once)")
    if not exact and not have <= given:
        raise _Refused(f"it uses the numbers {sorted(used)}, more than the puzzle's {sorted(numbers)}")


def _sympy_node(node: ast.AST) -> None:
    """A :data:`SYMPY` node's own rule: int or float constants, symbol-like names, calls
    by name to :data:`ELEMENTARY` with positional arguments."""
    if isinstance(node, ast.Constant) and type(node.value) not in (int, float):
        raise _Refused(describe(node))
    if isinstance(node, ast.Name) and (not _SYMBOL.fullmatch(node.id) or "__" in node.id):
        raise _Refused(describe(node))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in ELEMENTARY:
            raise _Refused(describe(node))
        if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            raise _Refused(f"{describe(node)} with keyword, starred or no arguments")


def check_sympy(text: str) -> None:
    """The :data:`SYMPY` grammar (module docstring). Raises ``_Refused``."""
    bad = next((c for c in text if not (" " <= c <= "~" or c in "\t\n")), None)
    if bad is not None:
        raise _Refused(f"the character {bad!r} (answers are ASCII)")
    _strict_tree(text, _SYMPY_NODES, _sympy_node)


def refusal(dataset: str, answer: str | None, metadata: Mapping[str, Any] | None = None, *,
            evaluates: bool = True) -> str | None:
    """Why ``answer`` to ``dataset`` is refused unscored (``"answer refused: ..."``, naming
    the rule it broke), or ``None`` when it may be scored. ``metadata``: the entry's (the
    puzzle numbers); ``evaluates``: whether the dataset's module reads as evaluating text."""
    grammar = grammar_of(dataset, evaluates)
    if grammar is None or answer is None:
        return None
    text = answer.strip()
    plain = PLAIN_TEXT.get(dataset)
    if grammar == LITERAL and plain is not None and plain.fullmatch(text):
        return None
    try:
        normal = unicodedata.normalize("NFKC", text)
        if _IDENTIFIER.findall(normal) != _IDENTIFIER.findall(text):
            raise _Refused("identifiers that Unicode NFKC normalisation changes (Python would read other names)")
        if grammar == ARITHMETIC:  # ASCII only: the text is its normal form
            check_arithmetic(text, (metadata or {}).get("numbers"), exact=dataset == "puzzle24")
        elif grammar == SYMPY:
            check_sympy(text)
        else:  # eval reads the text as given, Python's parser reads its identifiers normalised: check both
            check_literal(text)
            check_literal(normal)
    except _Refused as why:
        return f"answer refused: {why} ({dataset} answers may use only {ALLOWED[grammar]})"
    return None
