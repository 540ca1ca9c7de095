"""MathPython: math problems with a persistent, sandboxed Python interpreter (see env.py)."""

from environments.math_python.data import DATASETS, load_tasks
from environments.math_python.generated import generate_tasks
from environments.math_python.grading import Grader, extract_boxed_answer, normalize_answer

__all__ = ["DATASETS", "Grader", "extract_boxed_answer", "generate_tasks", "load_tasks", "normalize_answer"]
