"""The simulator: tasks with a known success martingale, for allocation benchmarks.

- :mod:`~trace_gym.sim.simulator`: the simulated tasks and their branch runner;
- :mod:`~trace_gym.sim.predictors`: predictors over simulator states (oracle, noisy, learned);
- :mod:`~trace_gym.sim.calibrate`: the simulator fitted to a rollout bank's counts.

May import: ``allocation``, ``budget``, ``predictor``, ``step``, ``tree``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/sim.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
