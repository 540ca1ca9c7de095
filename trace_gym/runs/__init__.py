"""Runs: what a run leaves on disk, and what reads it back.

- :mod:`~trace_gym.runs.run_dir`: :class:`RunDir` (config, metrics lines, atomic
  checkpoints, resume), with its checkpoint rules beside it in
  :mod:`~trace_gym.runs.checkpoint` (a manifest, when a checkpoint counts, weights-only),
  both over :mod:`~trace_gym.runs.files` (files written atomically, read as untrusted input);
- :mod:`~trace_gym.runs.reporters`: where a run's scalars go besides ``metrics.jsonl``;
- :mod:`~trace_gym.runs.compare` and :mod:`~trace_gym.runs.compare_arms`: runs and
  evaluations side by side, paired;
- :mod:`~trace_gym.runs.policies`: the one resolver of ``--policy`` (a model or ``RUN@STEP``);
  :mod:`~trace_gym.runs.weights`: the one name of a model folder's weights.

May import: ``config``, ``models``, ``report``, ``utils``.
"""
