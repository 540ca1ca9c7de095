"""The bench: allocation strategies compared at one budget, on any source of rollouts.

- :mod:`~trace_gym.bench.loop`: :func:`run_bench`, the one comparison loop, and
  :class:`BenchSource`;
- one source per mode, named in :mod:`~trace_gym.bench.modes`: :mod:`~trace_gym.bench.sim`
  (the simulator), :mod:`~trace_gym.bench.env` (live episodes), :mod:`~trace_gym.bench.bank`
  (a rollout bank);
- :mod:`~trace_gym.bench.checks`: the verdict (paired differences, checks, the headline);
- :mod:`~trace_gym.bench.report`: the printed and plotted report;
  :mod:`~trace_gym.bench.sweep`: one bench per root budget;
- :mod:`~trace_gym.bench.rank`: every arm ranked and paired with the references;
  :mod:`~trace_gym.bench.pair`: bench results paired after the fact (``compare A.json B.json``).

May import: ``agent``, ``allocation``, ``banks``, ``budget``, ``config``,
``config_sections``, ``engines``, ``env``, ``models``, ``predictor``, ``report``, ``runs``,
``sim``, ``step``, ``types``, ``utils``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/bench.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
