"""The environment contract: what an env is, how it is checked, and the boundary around foreign ones.

- :mod:`~trace_gym.env.contract`: :class:`AgentEnv`, snapshots; :mod:`~trace_gym.env.spaces`:
  text actions, chat-message observations;
- :mod:`~trace_gym.env.checks`: the conformance kit :func:`check_env`, played by
  :mod:`~trace_gym.env.play`;
- :mod:`~trace_gym.env.adapter`: other ecosystems' envs under the contract;
  :mod:`~trace_gym.env.boundary`: the one boundary foreign code and its replies cross, and
  :mod:`~trace_gym.env.process_state`: the process state it may change, put back;
- :mod:`~trace_gym.env.datafiles`: the rows of a local dataset file, and the held-out split.

May import: ``config``, ``types``, ``utils``.
"""


def __getattr__(name: str):  # a name of the old module trace_gym/env.py: one line naming its home
    from trace_gym import moved_name

    raise moved_name(__name__, name)
