"""Where a training run's trainer, engine and agent runners live: one injected object.

:func:`trace_gym.train.loop.train` builds three things from its backend, and closes it at the
end (in a ``finally``, whatever happened): the policy trainer, the rollout engine, and
one agent runner per step. :class:`InProcessBackend` (the default) builds them in this
process; :class:`trace_gym.train.distributed.backend.RayBackend` (``train --ray``) builds the
same interfaces on Ray actors. The loop is the same code either way.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable


@runtime_checkable
class TrainBackend(Protocol):
    """Builds what the training loop runs on (the arguments are those of
    :class:`~trace_gym.train.trainer.PolicyTrainer`, :func:`~trace_gym.engines.make_engine` and
    :class:`~trace_gym.agent.loop.AgentRunner`)."""

    def make_trainer(self, model_path: Any, config: Any, **kwargs: Any) -> Any:
        """The policy trainer (``step``, ``sync_weights``, ``save``, ``load_state``)."""
        ...

    def make_engine(self, kind: str, model_path: Any, **engine_kwargs: Any) -> Any:
        """The rollout engine (a :class:`~trace_gym.engines.RolloutEngine`)."""
        ...

    def make_runner(self, engine: Any, tokenizer: Any, make_env: Callable[[], Any], sampling: Any,
                    config: Any) -> Any:
        """One step's agent runner (``start_many``, ``branch``, ``advance``, ``close``)."""
        ...

    def close(self) -> None:
        """Release everything the backend started; idempotent, never raises on a second call."""
        ...


class InProcessBackend:
    """Everything in this process: :class:`~trace_gym.train.trainer.PolicyTrainer`, an engine
    from :func:`~trace_gym.engines.make_engine`, an :class:`~trace_gym.agent.loop.AgentRunner`
    (envs in a thread pool)."""

    def make_trainer(self, model_path: Any, config: Any, **kwargs: Any) -> Any:
        from trace_gym.train.trainer import PolicyTrainer

        return PolicyTrainer(model_path, config, **kwargs)

    def make_engine(self, kind: str, model_path: Any, **engine_kwargs: Any) -> Any:
        from trace_gym.engines import make_engine

        return make_engine(kind, model_path, **engine_kwargs)

    def make_runner(self, engine: Any, tokenizer: Any, make_env: Callable[[], Any], sampling: Any,
                    config: Any) -> Any:
        from trace_gym.agent.loop import AgentRunner

        return AgentRunner(engine, tokenizer, make_env, sampling, config)

    def close(self) -> None:
        pass


def backend_for(cfg: Any) -> TrainBackend:
    """The backend a config asks for: Ray when ``cfg.ray`` is set (``"local"`` or an
    address), else in process."""
    if getattr(cfg, "ray", None) is None:
        return InProcessBackend()
    from trace_gym.train.distributed.backend import RayBackend

    return RayBackend(cfg)
