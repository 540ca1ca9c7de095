"""The step: one strategy's waves over a branch runner, then the predictor's update.

- :mod:`~trace_gym.step.driver`: :func:`run_step`, the one step every runner shares (live
  episodes, the simulator, a bank);
- :mod:`~trace_gym.step.learning`: the learning half (the predictor's samples and update);
- :mod:`~trace_gym.step.strategy_boundary`: the boundary every call into a strategy crosses,
  and :mod:`~trace_gym.step.strategy_replay`: its calls replayed in a fresh process.

May import: ``allocation``, ``budget``, ``env``, ``predictor``, ``tree``.
"""
