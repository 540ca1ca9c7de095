"""An offline task family with a difficulty knob; every answer is computed with sympy.

==========  =================================================================  =========
difficulty  what a task asks                                                   steps
==========  =================================================================  =========
0           one operation on two integers (``37 + 58``, ``12 * 7``)            1
1           two operations with parentheses, or a sum of two fractions         2
2           a linear equation ``a x + b = c x + d`` (rational solution)        2-3
3           a 2x2 linear system (report ``x + y``) or the sum of squares of     3-4
            a quadratic's integer roots
4           a quadratic through three points (report ``f(k)``), or the sum of  4+
            the real roots of a cubic with integer roots
==========  =================================================================  =========

Levels 0-1 are within reach of a small (135M) model some of the time, levels 3-4 need
the Python tool or careful algebra. Generation is deterministic in ``seed`` (Python's
``random.Random``) and independent of numpy's version.
"""

from __future__ import annotations

import random
from typing import Callable, Sequence

import sympy

from trace_gym.types import Task

MAX_DIFFICULTY = 4
_X = sympy.Symbol("x")


def _latex(value: sympy.Expr) -> str:
    return sympy.latex(sympy.nsimplify(value))


def _nonzero(rng: random.Random, lo: int, hi: int) -> int:
    while True:
        v = rng.randint(lo, hi)
        if v:
            return v


def _level0(rng: random.Random) -> tuple[str, sympy.Expr]:
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    shown = {"+": "+", "-": "-", "*": "\\times"}[op]
    return f"What is ${a} {shown} {b}$?", sympy.Integer(value)


def _level1(rng: random.Random) -> tuple[str, sympy.Expr]:
    if rng.random() < 0.5:
        a, b, c = rng.randint(2, 30), rng.randint(2, 30), rng.randint(2, 12)
        if rng.random() < 0.5:
            return f"Compute $({a} + {b}) \\times {c}$.", sympy.Integer((a + b) * c)
        return f"Compute ${a} \\times {c} - {b}$.", sympy.Integer(a * c - b)
    p, q = rng.randint(1, 9), rng.randint(2, 12)
    r, s = rng.randint(1, 9), rng.randint(2, 12)
    value = sympy.Rational(p, q) + sympy.Rational(r, s)
    return (f"Compute $\\frac{{{p}}}{{{q}}} + \\frac{{{r}}}{{{s}}}$ and give the answer as a fraction "
            "in lowest terms.", value)


def _level2(rng: random.Random) -> tuple[str, sympy.Expr]:
    a, c = _nonzero(rng, -9, 9), _nonzero(rng, -9, 9)
    while c == a:
        c = _nonzero(rng, -9, 9)
    b, d = rng.randint(-20, 20), rng.randint(-20, 20)
    (solution,) = sympy.Poly((a - c) * _X + (b - d), _X).ground_roots()  # one rational root
    lhs, rhs = sympy.latex(a * _X + b), sympy.latex(c * _X + d)
    return f"Solve for $x$: ${lhs} = {rhs}$.", solution


def _level3(rng: random.Random) -> tuple[str, sympy.Expr]:
    if rng.random() < 0.5:
        y = sympy.Symbol("y")
        while True:
            a, b, c, d = (_nonzero(rng, -6, 6) for _ in range(4))
            if a * d - b * c:
                break
        x0, y0 = rng.randint(-9, 9), rng.randint(-9, 9)
        e1, e2 = sympy.Eq(a * _X + b * y, a * x0 + b * y0), sympy.Eq(c * _X + d * y, c * x0 + d * y0)
        sx, sy = sympy.Matrix([[a, b], [c, d]]).LUsolve(sympy.Matrix([e1.rhs, e2.rhs]))
        return (f"Solve the system ${sympy.latex(e1.lhs)} = {e1.rhs}$ and ${sympy.latex(e2.lhs)} = {e2.rhs}$. "
                "What is $x + y$?", sx + sy)
    r1, r2 = rng.randint(-9, 9), rng.randint(-9, 9)
    poly = sympy.expand((_X - r1) * (_X - r2))
    roots = sympy.roots(sympy.Poly(poly, _X), multiple=True)
    return (f"Let $r$ and $s$ be the roots of ${sympy.latex(poly)} = 0$. Find $r^2 + s^2$.",
            sympy.expand(sum(r**2 for r in roots)))


def _level4(rng: random.Random) -> tuple[str, sympy.Expr]:
    if rng.random() < 0.5:
        a, b, c = _nonzero(rng, -5, 5), rng.randint(-9, 9), rng.randint(-9, 9)
        f = a * _X**2 + b * _X + c
        points = rng.sample(range(-4, 5), 3)
        k = rng.choice([v for v in range(-6, 7) if v not in points])
        values = [f.subs(_X, p) for p in points]
        # the answer comes from solving the Vandermonde system with sympy, not from f itself
        coeffs = sympy.Matrix([[p * p, p, 1] for p in points]).LUsolve(sympy.Matrix(values))
        given = ", ".join(f"$f({p}) = {v}$" for p, v in zip(points, values))
        return (f"A quadratic $f(x) = ax^2 + bx + c$ satisfies {given}. Find $f({k})$.",
                coeffs[0] * k * k + coeffs[1] * k + coeffs[2])
    roots = [rng.randint(-6, 6) for _ in range(3)]
    lead = _nonzero(rng, -3, 3)
    poly = sympy.expand(lead * (_X - roots[0]) * (_X - roots[1]) * (_X - roots[2]))
    real_roots = set(sympy.Poly(poly, _X).ground_roots())  # integer roots by construction
    return (f"Find the sum of all distinct real numbers $x$ such that ${sympy.latex(poly)} = 0$.",
            sympy.Add(*real_roots))


_LEVELS: tuple[Callable[[random.Random], tuple[str, sympy.Expr]], ...] = (_level0, _level1, _level2, _level3, _level4)


def generate_tasks(n: int, difficulty: int | Sequence[int] = 1, seed: int = 0) -> list[Task]:
    """``n`` generated tasks; ``difficulty`` is a level in 0..4 or a sequence cycled over.

    Task ids are ``gen/d{level}/s{seed}/{i}``; ``metadata["difficulty"]`` holds the level
    and ``answer`` is the sympy-computed value as LaTeX.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    if not levels or any(not isinstance(d, int) or not 0 <= d <= MAX_DIFFICULTY for d in levels):
        raise ValueError(f"difficulty must be an int in 0..{MAX_DIFFICULTY} or a non-empty sequence of them, "
                         f"got {difficulty!r}")
    tasks = []
    for i in range(n):
        level = levels[i % len(levels)]
        rng = random.Random(f"{seed}/{level}/{i}")
        question, value = _LEVELS[level](rng)
        tasks.append(Task(id=f"gen/d{level}/s{seed}/{i}", prompt=question, answer=_latex(value),
                          source="generated", metadata={"difficulty": level}))
    return tasks


def generate_digit_sums(n: int, seed: int = 0, max_operand: int = 9) -> list[Task]:
    """``n`` plain-text sums of two integers in ``[1, max_operand]`` ("What is 3 + 4?").

    Below level 0: the offline CPU default's family, where SmolLM2-135M succeeds on
    roughly a fifth of samples (measured here: 23 % over 12 tasks x 4 samples at
    temperature 1 with last-number extraction), with per-task rates spread from 0 to
    0.75, so groups are sometimes mixed and sometimes not. Ids are
    ``sum/m{max_operand}/s{seed}/{i}``.
    """
    if n < 0 or max_operand < 1:
        raise ValueError(f"need n >= 0 and max_operand >= 1, got n={n}, max_operand={max_operand}")
    tasks = []
    for i in range(n):
        rng = random.Random(f"sum/{seed}/{max_operand}/{i}")
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        tasks.append(Task(id=f"sum/m{max_operand}/s{seed}/{i}", prompt=f"What is {a} + {b}?", answer=str(a + b),
                          source="generated", metadata={"difficulty": -1}))
    return tasks


def generate_mixed_tasks(n: int, seed: int = 0) -> list[Task]:
    """The offline CPU default's pool: digit sums (:func:`generate_digit_sums`, often
    solved by a 135M model) interleaved with levels 0-2 of :func:`generate_tasks`
    (rarely solved), so predicted success spreads from near 0 to near 1."""
    sums = generate_digit_sums((n + 1) // 2, seed=seed)
    harder = generate_tasks(n // 2, difficulty=(0, 1, 2), seed=seed)
    return [t for pair in zip(sums, harder + [None]) for t in pair if t is not None][:n]
