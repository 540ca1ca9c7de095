"""The text of MathPython's observations: the default prompts and notices, and the
formatting of cell results into observation text.

The constants are the defaults of :class:`~environments.math_python.env.MathPythonEnv`'s
template arguments (their fields, ``{output}``, ``{omitted}``, ``{limit}``, ``{reason}``,
``{count}``, ``{length}``, ``{cells}``, are documented in that module's docstring).
:func:`format_cell` writes one cell's result; :func:`cap_observation` bounds a whole
observation and escapes lone surrogates, so what the env returns is valid UTF-8.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from trace_gym.utils.textsafe import clean_text

if TYPE_CHECKING:
    from environments.math_python.sandbox import CellResult


SYSTEM_PROMPT = (
    "You are a careful math assistant with a Python interpreter. To run code, write it in a "
    "```python code block; it runs in a persistent session (variables persist between turns; numpy and "
    "sympy are installed) and you will see its output. When you know the answer, reply without any code "
    "block and put the final answer in \\boxed{}."
)
OUTPUT_TEMPLATE = "```output\n{output}\n```"
#: A one-shot demonstration of the format (code, output, boxed answer), inserted after
#: the system prompt when ``few_shot=True``; tiny models imitate it.
FEW_SHOT_DEMO = (
    ("user", "What is 3 + 5?"),
    ("assistant", "```python\nprint(3 + 5)\n```"),
    ("user", "```output\n8\n```"),
    ("assistant", "The answer is \\boxed{8}."),
)
TRUNCATION_MARKER = "\n[... output truncated: {omitted} bytes omitted ...]\n"
TIMEOUT_NOTICE = (
    "TimeoutError: the cell ran longer than {limit:g} s and was stopped. The Python session was restarted: "
    "all variables, imports and files from earlier cells are lost."
)
CRASH_NOTICE = (
    "KernelDied: the Python process died ({reason}). The Python session was restarted: all variables, "
    "imports and files from earlier cells are lost."
)
SKIPPED_NOTICE = "(not executed: this response's code already ran for {limit:g} s, the limit per response)"
STARTS_NOTICE = ("(not executed: this response's code needed {count} Python sessions, the limit per response; "
                 "the next response gets a new one)")
RESTART_NOTICE = (
    "(The Python session had died after the previous cell: {reason}. It was restarted for this cell: all "
    "variables, imports and files from earlier cells are lost.)"
)
BACKGROUND_NOTICE = "(printed after the previous cell had finished, by a background thread or process:)\n{output}"
CELLS_NOTICE = "({count} more code block(s) not executed: at most {limit} run per response)"
ACTION_TOO_LONG = (
    "Your response has {length} characters, over the limit of {limit}; it was not run and not graded. "
    "Write a shorter response."
)
INFRA_NOTICE = "(not executed: the Python sandbox could not be started; this is an infrastructure error, not yours)"
REPLAY_TIMEOUT_NOTICE = (
    "(not executed: this episode was restored, and re-running its {cells} earlier cell(s) to rebuild the Python "
    "session took longer than {limit:g} s, the limit for that. The episode ends here.)"
)


def format_cell(result: CellResult, templates: Mapping[str, str], limit: float, step_cut: bool = False) -> str:
    """One cell's output as observation text: background output (``templates["background"]``),
    stdout, stderr, then the traceback or the ``templates["timeout"]`` / ``templates["crash"]``
    notice; ``templates["empty"]`` when all are empty. Streams cut by the kernel show
    ``templates["truncation"]``. ``limit``: the seconds the cell had; ``step_cut``: it was
    stopped by the per-response budget, not the cell's own limit."""
    marker = templates["truncation"]
    parts = []
    background = "\n".join(s.text(marker).rstrip("\n") for s in result.background if s.head or s.tail)
    if background:
        parts.append(templates["background"].format(output=background))
    parts += [s.text(marker).rstrip("\n") for s in (result.stdout, result.stderr) if s.head or s.tail]
    if result.status == "error" and result.error:
        parts.append(result.error.rstrip("\n"))
    elif result.status == "timeout":
        if step_cut:  # stopped by the per-response budget, not the cell's own limit
            parts.append(templates["timeout"].format(limit=limit).replace(
                "the cell ran longer than", "this response's code ran longer than its remaining"))
        else:
            parts.append(templates["timeout"].format(limit=limit))
    elif result.status in ("crashed", "dead"):
        parts.append(templates["crash"].format(reason=result.error or result.error_name))
    return clean_text("\n".join(parts)) if parts else templates["empty"]


def cap_observation(text: str, max_chars: int, truncation_marker: str) -> str:
    """``text`` within ``max_chars`` characters: head 3/4 and tail 1/4 around
    ``truncation_marker`` (field ``{omitted}``, in characters)."""
    text = clean_text(text)
    if len(text) <= max_chars:
        return text
    keep = max_chars - 80
    head, tail = keep - keep // 4, keep // 4
    marker = truncation_marker.format(omitted=len(text) - head - tail)
    return text[:head] + marker + text[len(text) - tail:]
