"""Adapters of other ecosystems' envs (gem, skyrl-gym, verifiers, OpenEnv, reasoning-gym) to the trace_gym contract."""
