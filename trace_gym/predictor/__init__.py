"""Success predictors: P(the current policy eventually succeeds | history).

- :mod:`~trace_gym.predictor.kinds`: the :class:`SuccessPredictor` Protocol, the built-in
  kinds and the one table :data:`PREDICTORS`;
- :mod:`~trace_gym.predictor.critic`: the LM critic (a causal LM with a scalar head);
- :mod:`~trace_gym.predictor.memory`: what a predictor remembers (replay buffer, evidence);
- :mod:`~trace_gym.predictor.quality`: what selection needs from it, measured where used.
- :mod:`~trace_gym.predictor.embeddings`: the frozen encoder's embeddings, once per process
  and (a bank bench's ``embedding_cache``) on disk per encode call.

May import: ``engines``, ``models``, ``report``, ``utils``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/predictor.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
