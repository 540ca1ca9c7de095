"""Utilities every layer may import: string hints, untrusted text, threads, determinism.

- :mod:`~trace_gym.utils.suggest`: ``did you mean`` hints for one-line errors;
- :mod:`~trace_gym.utils.textsafe`: JSON bounded before it is parsed, text that encodes;
- :mod:`~trace_gym.utils.threads`: each component's torch thread count;
- :mod:`~trace_gym.utils.determinism`: deterministic mode.

May import: nothing of trace_gym (every layer may import it).
"""
