"""The agent: a policy talking to an env, token ids in and out.

- :mod:`~trace_gym.agent.loop`: :class:`AgentRunner`, the token-in-token-out agent loop,
  and :class:`AgentConfig`;
- :mod:`~trace_gym.agent.episode`: what the loop records (:class:`Turn`, :class:`Episode`);
- :mod:`~trace_gym.agent.chat`: chat-template token deltas;
- :mod:`~trace_gym.agent.rollout`: the loop as a branch runner of the step driver
  (:class:`AgentBranchRunner`, :func:`collect`);
- :mod:`~trace_gym.agent.transcripts`: finished trees written out episode by episode.

May import: ``allocation``, ``budget``, ``env``, ``predictor``, ``step``, ``tree``,
``types``, ``utils``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/agent.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
