"""Training: the loop, top to bottom, and what it updates the policy with.

- :mod:`~trace_gym.train.loop`: :func:`train`, the training loop;
- :mod:`~trace_gym.train.advantages`: the estimators; :mod:`~trace_gym.train.batches`:
  token batches over trees; :mod:`~trace_gym.train.trainer`: the PPO-clip update
  (:mod:`~trace_gym.train.update_stats`: its metrics);
- :mod:`~trace_gym.train.backend`: where the trainer, engine and runners live: in process,
  or :mod:`trace_gym.train.distributed` on Ray;
- :mod:`~trace_gym.train.metrics`: a step's metrics line; :mod:`~trace_gym.train.dry_run`:
  ``train --dry-run``.

May import: ``agent``, ``budget``, ``config``, ``config_sections``, ``engines``, ``env``,
``models``, ``predictor``, ``report``, ``runs``, ``step``, ``tree``, ``types``, ``utils``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/train.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
