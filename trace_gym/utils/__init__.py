"""Utilities every layer may import: string hints, untrusted text, threads, determinism.

- :mod:`~trace_gym.utils.suggest`: ``did you mean`` hints for one-line errors;
- :mod:`~trace_gym.utils.textsafe`: JSON bounded before it is parsed, text that encodes;
- :mod:`~trace_gym.utils.threads`: each component's torch thread count;
- :mod:`~trace_gym.utils.determinism`: deterministic mode;
- :mod:`~trace_gym.utils.targets`: the one ``load_target("module:attr")``;
- :mod:`~trace_gym.utils.moved`: the module paths that stood at the root before the wings,
  each failing with its new home.

May import: nothing of trace_gym (every layer may import it).
"""
