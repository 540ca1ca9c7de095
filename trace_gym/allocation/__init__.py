"""Allocation: how a step's rollout budget is split, as exact, pure math.

- :mod:`~trace_gym.allocation.allocators`: the Protocols a strategy implements
  (:class:`RootAllocator`, :class:`PrefixAllocator`) and TRACE's allocators;
- :mod:`~trace_gym.allocation.solvers`: the exact solvers :func:`solve_root` and
  :func:`solve_prefix`; :mod:`~trace_gym.allocation.dp`: the reference dynamic program;
- :mod:`~trace_gym.allocation.split`: a prompt's budget split between roots and continuations;
- :mod:`~trace_gym.allocation.strategy`: :class:`Strategy` = root allocator + prefix
  allocator + budget shape;
- :mod:`~trace_gym.allocation.planning`: one step's allocation decisions (pure functions);
- :mod:`~trace_gym.allocation.waves`: what a strategy sees before each wave and returns.

May import: ``tree``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/allocation.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
