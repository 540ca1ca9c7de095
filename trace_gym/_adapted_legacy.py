# TEMPORARY (issue 37c): the old base class, while the adapters move to ForeignEnv; deleted at the end.
"""Run another framework's environment under our contract, snapshots included.

The environments of other ecosystems (GEM, verifiers, OpenEnv, skyrl-gym, reasoning-gym;
``environments/ecosystems``) cannot snapshot an episode mid-way, yet prefix replay needs
exactly that. :class:`AdaptedEnv` is the base of their adapters: a subclass says how to
begin an episode of the wrapped env and how to apply one action, and the base supplies
our :class:`~trace_gym.env.AgentEnv` (text actions, ``list[Message]`` observations,
``snapshot``/``restore``) with one of three snapshot strategies:

``native``
    the wrapped env offers its own state capture (``_native_snapshot``/``_native_restore``).
``copy``
    the wrapped env's state is plain Python: the snapshot is a pickled deep copy of it
    (``_state``/``_set_state``, by default the ``inner`` object itself), with the
    private random state of envs that draw from the process-global ``random`` module.
``replay``
    anything else, as long as it is deterministic: the snapshot is the task, the episode
    seed and the actions taken; ``restore`` begins a fresh episode with that seed and
    re-applies the actions (counted as exact cost, :class:`~trace_gym.env.ReplayCost`).
    Every replayed observation is checked against a digest kept in the snapshot, so a
    non-deterministic env is caught (:class:`ReplayDivergence`, naming the turn) rather
    than silently branching from a different state; ``check_env`` refuses such an env.

Every call into the wrapped env (begin, act, the copy and native snapshot hooks, end) goes
through the instance's :class:`~trace_gym.env_boundary.ForeignBoundary` (:attr:`AdaptedEnv.boundary`):
a deadline per call, foreign ``BaseException`` s contained, the process state put back, the
private global-RNG state swapped in, and every reply checked and bounded. A wrapped env that
raises on an action (malformed model output, a dead server), replies outside the contract
(a flag that is not a bool) or gives no reply in time ends that episode as truncated, with
``info["env_error"]`` and an observation the model can read; it never raises into the
rollout batch.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from typing import Any, Callable, ClassVar, Mapping, Sequence

import gymnasium

from trace_gym.env import ReplayDivergence, Snapshot, freeze, task_from_options, thaw
from trace_gym.env_boundary import ForeignBoundary, ForeignEnvError, PrivateRandom, error_text
from trace_gym.process_state import seeded_rng_state
from trace_gym.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task

#: The snapshot strategies an adapter may use (``check_env`` reports which one it got).
SNAPSHOT_STRATEGIES = ("native", "copy", "replay")

GymStep = tuple[list[Message], float, bool, bool, dict]  # gymnasium's (obs, reward, terminated, truncated, info)

_log = logging.getLogger(__name__)


def _digest(obs: Sequence[Message], reward: float | None = None, terminated: bool = False,
            truncated: bool = False) -> str:
    """A short fingerprint of one turn's outcome, kept in replay snapshots."""
    text = repr(([(m.role, m.content) for m in obs], reward, bool(terminated), bool(truncated)))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


class AdaptedEnv(gymnasium.Env):
    """Base of the ecosystem adapters (see the module docstring).

    Subclasses implement :meth:`_begin` and :meth:`_act`, and may override
    :meth:`_state`/:meth:`_set_state` (copy), :meth:`_native_snapshot`/
    :meth:`_native_restore` (native), :meth:`_end` (release the wrapped env),
    :meth:`_default_tasks` (the pool of a reset without a task) and :meth:`_load_task`
    (a task by id).

    Class attributes:
        snapshot_strategies: the strategies the adapter supports; the first is its default.
        global_rng: the wrapped env draws from ``random``/``numpy.random`` globals; each
            instance then owns a private copy of that state, swapped in around every begin
            and act (seeded from the episode seed at :meth:`reset`), so envs never perturb
            each other and ``copy``/``replay`` snapshots stay exact. An instance may set its
            own ``self.global_rng`` before its first reset (an I/O-bound env that draws no
            randomness can skip the lock it costs).

    Args:
        snapshot: one of :attr:`snapshot_strategies` (default: the first).
        max_turns: truncate after this many steps (``None``: the wrapped env decides).
        call_timeout_s: seconds one call into the wrapped env may take (``None``: the
            boundary's default, :data:`~trace_gym.env_boundary.DEFAULT_CALL_TIMEOUT_S`).
        max_observation_chars: longest observation of one turn, in characters (``None``:
            :data:`~trace_gym.env_boundary.MAX_OBSERVATION_CHARS`).
    """

    metadata = {"render_modes": []}
    snapshot_strategies: ClassVar[tuple[str, ...]] = ("copy", "replay")
    global_rng: ClassVar[bool] = False

    def __init__(self, *, snapshot: str | None = None, max_turns: int | None = None,
                 call_timeout_s: float | None = None, max_observation_chars: int | None = None):
        strategy = snapshot or self.snapshot_strategies[0]
        if strategy not in self.snapshot_strategies:
            raise ValueError(f"snapshot={strategy!r}: {type(self).__name__} supports {list(self.snapshot_strategies)}")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be a positive int or None, got {max_turns!r}")
        self.snapshot_strategy = strategy
        #: our contract's mode: a replay strategy re-executes, the others restore state
        self.snapshot_mode = "replay" if strategy == "replay" else "state"
        self.max_turns = max_turns
        self.action_space = TextAction(max_length=1 << 16)
        self.observation_space = ChatObservation()
        self.inner: Any = None  # the wrapped env (set by _begin)
        self._task: Task | None = None
        self._seed = 0
        self._actions: list[str] = []
        self._digests: list[str] = []
        self._done = False
        #: every call into the wrapped env, and every reply, passes through it
        self.boundary = ForeignBoundary(call_timeout_s=call_timeout_s, max_observation_chars=max_observation_chars)
        self._random = PrivateRandom()  # the private (random, numpy.random) state when global_rng

    # -- what a subclass implements ------------------------------------------------
    def _begin(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        """Start a fresh episode of the wrapped env on ``task`` with ``seed``; set
        :attr:`inner`; return the first observation and info."""
        raise NotImplementedError

    def _act(self, action: str) -> GymStep:
        """Apply one action to the wrapped env: ``(obs, reward, terminated, truncated, info)``."""
        raise NotImplementedError

    def _state(self) -> Any:
        """What the ``copy`` strategy deep-copies (by pickling): by default :attr:`inner`."""
        return self.inner

    def _set_state(self, state: Any) -> None:
        """Install a fresh copy made from :meth:`_state`'s value."""
        self._end()
        self.inner = state

    def _native_snapshot(self) -> Any:
        """The wrapped env's own state capture (``native`` strategy); picklable."""
        raise NotImplementedError

    def _native_restore(self, payload: Any) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        """Release the wrapped env of the current episode (called before a new one)."""

    def _default_tasks(self) -> Sequence[Task]:
        """Tasks a ``reset()`` without ``options["task"]`` draws from."""
        return ()

    def _load_task(self, task_id: str) -> Task:
        raise ValueError(f"{type(self).__name__} cannot load a task by id ({task_id!r}); pass the Task")

    # -- the contract ----------------------------------------------------------------
    @property
    def env_key(self) -> str:
        """What a snapshot records as its maker (checked by ``restore``)."""
        return type(self).__name__

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        given = options is not None and (options.get("task") is not None or options.get("task_id") is not None)
        pool = () if given else list(self._default_tasks())  # the pool only when it is drawn from
        task = task_from_options(options, pool, self.np_random, self._load_task)
        episode_seed = task.metadata.get("seed") if isinstance(task.metadata.get("seed"), int) else None
        if episode_seed is None:
            episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        obs, info = self._start(task, episode_seed)
        self._digests = [_digest(obs)]
        return obs, {"task_id": task.id, **info}

    def _foreign(self, what: str, fn: Callable[..., Any], *args: Any, private_rng: bool = False) -> Any:
        """``fn(*args)`` through :attr:`boundary`; with ``private_rng`` (begin, act, make) under
        this instance's private global-RNG state when :attr:`global_rng` is set."""
        rng = self._random if private_rng and self.global_rng else None
        return self.boundary.call(what, fn, *args, where=self.env_key, rng=rng)

    def _start(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        self._foreign("close", self._end)
        self.inner = None
        self._task, self._seed, self._actions, self._done = task, seed, [], False
        try:
            if self.global_rng:
                self._random.state = seeded_rng_state(seed)
            return self.boundary.reset_reply(self._foreign("reset", self._begin, task, seed, private_rng=True))
        except BaseException:
            self._task = None  # no episode began: step() must not act on it
            raise

    def _apply(self, action: str) -> GymStep:
        """One step through the wrapped env: its failures, a reply outside the contract and
        a call past its deadline all end the episode as a truncated turn."""
        try:
            reply = self._foreign("step", self._act, action, private_rng=True)
            obs, reward, terminated, truncated, info = self.boundary.step_reply(reply)
        except Exception as exc:  # noqa: BLE001  (foreign code on model output; a BaseException arrives wrapped)
            obs, reward, terminated, truncated, info = self.boundary.error_turn(exc)
        self._actions.append(action)
        if self.max_turns is not None and len(self._actions) >= self.max_turns and not terminated:
            truncated = True
        self._done = terminated or truncated
        return obs, reward, terminated, truncated, info

    def step(self, action: str):
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return [Message("user", "The episode is over.")], 0.0, True, False, {"error": "episode_over"}
        text = action if isinstance(action, str) else ""
        obs, reward, terminated, truncated, info = self._apply(text)
        self._digests.append(_digest(obs, reward, terminated, truncated))
        return obs, reward, terminated, truncated, info

    def snapshot(self) -> Snapshot:
        if self._task is None:
            raise RuntimeError("call reset() before snapshot()")
        head = (self._task, self._seed, tuple(self._actions), self._done)
        if self.snapshot_strategy == "replay":
            body: Any = tuple(self._digests)
        elif self.snapshot_strategy == "copy":
            try:
                body = (self._foreign("snapshot", self._pickled_state), self._random.state)
            except ForeignEnvError:
                raise
            except Exception as exc:  # noqa: BLE001  (whatever the wrapped env holds)
                raise TypeError(f"{self.env_key}: the copy snapshot strategy cannot copy the wrapped env "
                                f"({error_text(exc)}); use snapshot='replay'") from exc
        else:
            body = (self._foreign("snapshot", self._native_snapshot), self._random.state)
        return Snapshot(self.env_key, self.snapshot_mode, len(self._actions), freeze((head, body)))

    def _pickled_state(self) -> bytes:
        return pickle.dumps(self._state(), protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != self.env_key:
            raise ValueError(f"snapshot from {snapshot.env_id!r} cannot restore a {self.env_key}")
        (task, seed, actions, done), body = thaw(snapshot.state)
        if self.snapshot_strategy == "replay":
            self._replay(task, seed, actions, body)
        else:
            blob, rng = body
            self._task, self._seed, self._actions, self._done = task, seed, list(actions), done
            if self.snapshot_strategy == "copy":
                self._foreign("restore", lambda: self._set_state(pickle.loads(blob)))
            else:
                self._foreign("restore", self._native_restore, blob)
            self._random.state = rng
        self._done = done

    def _replay(self, task: Task, seed: int, actions: Sequence[str], digests: Sequence[str]) -> None:
        obs, _info = self._start(task, seed)
        if _digest(obs) != digests[0]:
            raise ReplayDivergence(0, " (the first observation)")
        self._digests = [digests[0]]
        for turn, action in enumerate(actions, start=1):
            obs, reward, terminated, truncated, _info = self._apply(action)
            got = _digest(obs, reward, terminated, truncated)
            if got != digests[turn]:
                text = " ".join(m.content for m in obs)
                raise ReplayDivergence(turn, f" (now: {text[:200]!r})")
            self._digests.append(got)

    def replay_steps(self, snapshot: Snapshot) -> int:
        """Env steps a :meth:`restore` of ``snapshot`` re-runs (:class:`~trace_gym.env.ReplayCost`):
        its turn under the replay strategy, else 0."""
        return snapshot.turn if self.snapshot_strategy == "replay" else 0

    def close(self) -> None:
        try:
            if self.boundary.stuck:  # a call given up still runs on the wrapped env: leave it be
                _log.warning("%s: closed without ending the wrapped env (a call given up still runs on it)",
                             self.env_key)
            else:
                self._foreign("close", self._end)
        finally:
            self.inner = None


