"""Run another framework's environment under our contract, snapshots included.

The environments of other ecosystems (GEM, verifiers, OpenEnv, skyrl-gym, reasoning-gym;
``environments/ecosystems``) cannot snapshot an episode mid-way, yet prefix replay needs
exactly that. Two parts, joined by composition:

* a :class:`ForeignEpisode`, what an ecosystem supplies: a plain class that says how to
  begin an episode of the wrapped env and how to apply one action (and, optionally, how
  to copy its state), knowing nothing of snapshots, deadlines or our message contract;
* :class:`ForeignEnv`, one generic ``gymnasium.Env`` that holds an episode driver and a
  :class:`~trace_gym.env.boundary.ForeignBoundary` and supplies our
  :class:`~trace_gym.env.contract.AgentEnv` (text actions, ``list[Message]`` observations,
  ``snapshot``/``restore``) with one of three snapshot strategies:

``native``
    the wrapped env offers its own state capture (:class:`NativeState`).
``copy``
    the wrapped env's state is plain Python: the snapshot is a pickled deep copy of what
    the driver's ``state()`` returns (:class:`CopyState`), with the private random state
    of envs that draw from the process-global ``random`` module.
``replay``
    anything else, as long as it is deterministic: the snapshot is the task, the episode
    seed and the actions taken; ``restore`` begins a fresh episode with that seed and
    re-applies the actions (counted as exact cost, :class:`~trace_gym.env.contract.ReplayCost`).
    Every replayed turn is checked against a digest kept in the snapshot (each observation
    whole, before it is cut to ``max_observation_chars``, with its reward and flags), so
    a non-deterministic env whose difference shows in what it returns is caught
    (:class:`ReplayDivergence`, naming the turn) rather than silently branching from a
    different state; ``check_env`` refuses such an env. Randomness that stays hidden in
    the env's state through every replayed turn is not seen: the branches after the
    restore then differ from the original's future without an error.

Every call into the driver (begin, act, the copy and native snapshot hooks, end, prepare)
goes through the instance's :class:`~trace_gym.env.boundary.ForeignBoundary`
(:attr:`ForeignEnv.boundary`): a deadline per call, foreign ``BaseException`` s contained,
the process state put back, the private global-RNG state swapped in, and every reply
checked and bounded. A wrapped env that raises on an action (malformed model output, a
dead server), replies outside the contract (a flag that is not a bool) or gives no reply
in time ends that episode as truncated, with ``info["env_error"]`` and an observation the
model can read; it never raises into the rollout batch.

The five adapters each pair a driver (``GemEpisode``, ...) with a thin named
:class:`ForeignEnv` subclass (``GemEnv``, ...) that only builds the driver from its
keyword arguments, so ``gymnasium.make`` and ``env_difficulty_knobs`` can name a class.
(Until issue 37, ``AdaptedEnv`` was a base class adapters overrode ``_begin``/``_act`` of;
docs/ecosystem.md has the one-to-one migration.)
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import gymnasium

from trace_gym.env.contract import ReplayDivergence, Snapshot, freeze, task_from_options, thaw
from trace_gym.env.boundary import ForeignBoundary, ForeignEnvError, PrivateRandom, error_text
from trace_gym.env.process_state import seeded_rng_state
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task

#: The snapshot strategies an adapter may use (``check_env`` reports which one it got).
SNAPSHOT_STRATEGIES = ("native", "copy", "replay")

GymStep = tuple[list[Message], float, bool, bool, dict]  # gymnasium's (obs, reward, terminated, truncated, info)

_log = logging.getLogger(__name__)


@runtime_checkable
class ForeignEpisode(Protocol):
    """What an ecosystem supplies to :class:`ForeignEnv`: episodes of its wrapped env.

    A driver holds the wrapped env of the current episode itself; :class:`ForeignEnv`
    calls every method below through its boundary (so a driver may raise, hang or reply
    loosely: flags and rewards are checked there), never two at once.

    Attributes:
        snapshot_strategies: the strategies the driver supports; the first is the default.
            ``copy`` needs :class:`CopyState`, ``native`` :class:`NativeState`.
        global_rng: the wrapped env draws from the ``random``/``numpy.random`` globals;
            each env then owns generators of its own, which those globals draw from on
            the thread that runs its begin, act and prepare (seeded from the episode seed
            at ``reset``; :func:`trace_gym.env.process_state.bind_generators`), so envs never
            perturb each other and ``copy``/``replay`` snapshots stay exact. Read at
            every call: an instance may set its own before its first reset (an I/O-bound
            env that draws no randomness can skip the state copy it costs per call).
        env_key: what a snapshot records as its maker (checked by ``restore``).

    Optional methods, looked up by name: ``prepare()`` (called once through the boundary,
    under the private RNG, when the env is built: make the wrapped env once so that a
    configuration it refuses fails then, not at the first reset) and ``close()`` (release
    what outlives episodes, a server session; called outside the boundary by
    :meth:`ForeignEnv.close`, after :meth:`end`).
    """

    snapshot_strategies: tuple[str, ...]
    global_rng: bool
    env_key: str

    def begin(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        """Start a fresh episode of the wrapped env on ``task`` with ``seed``: the first
        observation and info."""

    def act(self, action: str) -> GymStep:
        """Apply one action: ``(obs, reward, terminated, truncated, info)``."""

    def end(self) -> None:
        """Release the wrapped env of the current episode (before a new one, and at close)."""

    def default_tasks(self) -> Sequence[Task]:
        """Tasks a ``reset()`` without ``options["task"]`` draws from (may be empty)."""

    def load_task(self, task_id: str) -> Task:
        """The task of ``task_id``; ``ValueError`` (one line) for an id it cannot load."""


@runtime_checkable
class CopyState(Protocol):
    """A driver whose episode state is plain Python (the ``copy`` strategy)."""

    def state(self) -> Any:
        """What a snapshot deep-copies, by pickling (the wrapped env, or the driver's record)."""

    def set_state(self, state: Any) -> None:
        """Install a fresh copy made from :meth:`state`'s value (release the current one)."""


@runtime_checkable
class NativeState(Protocol):
    """A driver whose wrapped env captures its own state (the ``native`` strategy)."""

    def native_snapshot(self) -> Any:
        """The wrapped env's state capture; picklable."""

    def native_restore(self, payload: Any) -> None:
        """Put the wrapped env back to ``payload``."""


#: the protocol each snapshot strategy needs of a driver, beyond :class:`ForeignEpisode`
STRATEGY_NEEDS: dict[str, type | None] = {"copy": CopyState, "native": NativeState, "replay": None}


def _digest(obs: Sequence[Message] | str, reward: float | None = None, terminated: bool = False,
            truncated: bool = False) -> str:
    """A short fingerprint of one turn's outcome, kept in replay snapshots; ``obs``: the
    observation, or the boundary's fingerprint of it whole (before any cut)."""
    shown = obs if isinstance(obs, str) else [(m.role, m.content) for m in obs]
    text = repr((shown, reward, bool(terminated), bool(truncated)))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def episode_problems(episode: Any) -> list[str]:
    """What ``episode`` lacks of :class:`ForeignEpisode` (and of the protocol each of its
    declared strategies needs), as member names; ``[]`` when it has it all."""
    missing = [name for name in ("snapshot_strategies", "global_rng", "env_key") if not hasattr(episode, name)]
    missing += [name for name in ("begin", "act", "end", "default_tasks", "load_task")
                if not callable(getattr(episode, name, None))]
    strategies = tuple(getattr(episode, "snapshot_strategies", ()) or ())
    if hasattr(episode, "snapshot_strategies") and (not strategies or not set(strategies) <= set(SNAPSHOT_STRATEGIES)):
        missing.append(f"snapshot_strategies drawn from {list(SNAPSHOT_STRATEGIES)} (it has {list(strategies)})")
    for strategy in strategies:
        need = STRATEGY_NEEDS.get(strategy)
        if need is not None:
            missing += [f"{name} (for {strategy!r})" for name in ("state", "set_state", "native_snapshot",
                                                                 "native_restore")
                        if hasattr(need, name) and not callable(getattr(episode, name, None))]
    return missing


class ForeignEnv(gymnasium.Env):
    """Our :class:`~trace_gym.env.contract.AgentEnv` around a :class:`ForeignEpisode` driver (see
    the module docstring): reset, step, the three snapshot strategies, replay and close,
    every call into the driver through :attr:`boundary`.

    Args:
        episode: the driver (checked against :class:`ForeignEpisode` and the protocol of
            each strategy it declares: one ``TypeError`` naming what it lacks).
        snapshot: one of the driver's ``snapshot_strategies`` (default: its first).
        max_turns: truncate after this many steps (``None``: the wrapped env decides).
        call_timeout_s: seconds one call into the driver may take (``None``: the
            boundary's default, :data:`~trace_gym.env.boundary.DEFAULT_CALL_TIMEOUT_S`).
        max_observation_chars: longest observation of one turn, in characters (``None``:
            :data:`~trace_gym.env.boundary.MAX_OBSERVATION_CHARS`).
    """

    metadata = {"render_modes": []}

    def __init__(self, episode: ForeignEpisode, *, snapshot: str | None = None, max_turns: int | None = None,
                 call_timeout_s: float | None = None, max_observation_chars: int | None = None):
        try:
            strategy = self._checked(episode, snapshot, max_turns)
        except (TypeError, ValueError):
            release = getattr(episode, "close", None)
            if callable(release):
                release()  # a driver built for an env that refuses its options is let go of at once
            raise
        self.episode = episode
        self.snapshot_strategy = strategy
        #: our contract's mode: a replay strategy re-executes, the others restore state
        self.snapshot_mode = "replay" if strategy == "replay" else "state"
        self.max_turns = max_turns
        self.action_space = TextAction(max_length=1 << 16)
        self.observation_space = ChatObservation()
        self._task: Task | None = None
        self._seed = 0
        self._actions: list[str] = []
        self._digests: list[str] = []
        self._whole: Any = ""  # the last turn's observation as digested (the boundary's fingerprint of it whole)
        self._done = False
        #: every call into the driver, and every reply, passes through it
        self.boundary = ForeignBoundary(call_timeout_s=call_timeout_s, max_observation_chars=max_observation_chars)
        self._random = PrivateRandom()  # the private (random, numpy.random) state when global_rng
        prepare = getattr(episode, "prepare", None)
        if callable(prepare):
            self._foreign("make", prepare, private_rng=True)

    def _checked(self, episode: Any, snapshot: str | None, max_turns: int | None) -> str:
        """The snapshot strategy to use; one-line errors for a driver that is not a
        :class:`ForeignEpisode`, a strategy it does not support, a bad ``max_turns``."""
        problems = episode_problems(episode)
        if problems:
            raise TypeError(f"{type(episode).__name__} is not a ForeignEpisode: it lacks {', '.join(problems)}")
        strategies = tuple(episode.snapshot_strategies)
        strategy = snapshot or strategies[0]
        if strategy not in strategies:
            raise ValueError(f"snapshot={strategy!r}: {type(self).__name__} supports {list(strategies)}")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be a positive int or None, got {max_turns!r}")
        return strategy

    @property
    def env_key(self) -> str:
        """What a snapshot records as its maker (the driver's ``env_key``; checked by ``restore``)."""
        return self.episode.env_key

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        given = options is not None and (options.get("task") is not None or options.get("task_id") is not None)
        pool = () if given else list(self.episode.default_tasks())  # the pool only when it is drawn from
        task = task_from_options(options, pool, self.np_random, self.episode.load_task)
        episode_seed = task.metadata.get("seed") if isinstance(task.metadata.get("seed"), int) else None
        if episode_seed is None:
            episode_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31))
        obs, info = self._start(task, episode_seed)
        self._digests = [_digest(self._whole)]
        return obs, {"task_id": task.id, **info}

    def _foreign(self, what: str, fn: Callable[..., Any], *args: Any, private_rng: bool = False) -> Any:
        """``fn(*args)`` through :attr:`boundary`; with ``private_rng`` (begin, act, make) under
        this instance's private global-RNG state when the driver's ``global_rng`` is set."""
        rng = self._random if private_rng and self.episode.global_rng else None
        return self.boundary.call(what, fn, *args, where=self.env_key, rng=rng)

    def _start(self, task: Task, seed: int) -> tuple[list[Message], dict[str, Any]]:
        self._foreign("close", self.episode.end)
        self._task, self._seed, self._actions, self._done = task, seed, [], False
        try:
            if self.episode.global_rng:
                self._random.state = seeded_rng_state(seed)
            reply = self.boundary.reset_reply(self._foreign("reset", self.episode.begin, task, seed, private_rng=True))
            self._whole = self.boundary.fingerprint
            return reply
        except ForeignEnvError:  # named by the boundary already
            self._task = None
            raise
        except Exception as exc:  # the wrapped env's own error, or its reply outside the contract
            self._task = None  # no episode began: step() must not act on it
            raise named_error(exc, self.env_key, "reset") from exc
        except BaseException:
            self._task = None
            raise

    def _apply(self, action: str) -> GymStep:
        """One step through the driver: its failures, a reply outside the contract and a
        call past its deadline all end the episode as a truncated turn."""
        try:
            reply = self._foreign("step", self.episode.act, action, private_rng=True)
            obs, reward, terminated, truncated, info = self.boundary.step_reply(reply)
            self._whole = self.boundary.fingerprint
        except Exception as exc:  # noqa: BLE001  (foreign code on model output; a BaseException arrives wrapped)
            obs, reward, terminated, truncated, info = self.boundary.error_turn(exc)
            self._whole = obs
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
        self._digests.append(_digest(self._whole, reward, terminated, truncated))
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
            body = (self._foreign("snapshot", self.episode.native_snapshot), self._random.state)
        return Snapshot(self.env_key, self.snapshot_mode, len(self._actions), freeze((head, body)))

    def _pickled_state(self) -> bytes:
        return pickle.dumps(self.episode.state(), protocol=pickle.HIGHEST_PROTOCOL)

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
                self._foreign("restore", lambda: self.episode.set_state(pickle.loads(blob)))
            else:
                self._foreign("restore", self.episode.native_restore, blob)
            self._random.state = rng
        self._done = done

    def _replay(self, task: Task, seed: int, actions: Sequence[str], digests: Sequence[str]) -> None:
        self._start(task, seed)
        if _digest(self._whole) != digests[0]:
            raise ReplayDivergence(0, " (the first observation)", self._copy_possible())
        self._digests = [digests[0]]
        for turn, action in enumerate(actions, start=1):
            obs, reward, terminated, truncated, _info = self._apply(action)
            got = _digest(self._whole, reward, terminated, truncated)
            if got != digests[turn]:
                text = " ".join(m.content for m in obs)
                raise ReplayDivergence(turn, f" (now: {text[:200]!r})", self._copy_possible())
            self._digests.append(got)

    def _copy_possible(self) -> bool:
        """Whether the driver offers snapshot='copy' (verifiers and OpenEnv episodes replay only)."""
        return "copy" in self.episode.snapshot_strategies

    def replay_steps(self, snapshot: Snapshot) -> int:
        """Env steps a :meth:`restore` of ``snapshot`` re-runs (:class:`~trace_gym.env.contract.ReplayCost`):
        its turn under the replay strategy, else 0."""
        return snapshot.turn if self.snapshot_strategy == "replay" else 0

    def close(self) -> None:
        try:
            if self.boundary.stuck:  # a call given up still runs on the wrapped env: leave it be
                _log.warning("%s: closed without ending the wrapped env (a call given up still runs on it)",
                             self.env_key)
            else:
                self._foreign("close", self.episode.end)
        finally:
            release = getattr(self.episode, "close", None)
            if callable(release):
                release()


def named_error(exc: Exception, where: str, what: str) -> Exception:
    """``exc`` as the caller gets it: one line that names the env (``where``) and the call, of
    ``exc``'s own type where that type takes the message (so a caller's ``except`` clauses
    still hold), else a :class:`~trace_gym.env.boundary.ForeignEnvError`; ``exc`` itself when
    its message names the env already."""
    text = " ".join(error_text(exc).split())  # one line
    if where in text:
        return exc
    text = f"{where}: its {what} raised {text}"
    try:
        named = type(exc)(text)
        if str(named) == text:
            return named
    except Exception:  # noqa: BLE001  (a type whose constructor wants more than a message)
        pass
    return ForeignEnvError(text)


def __getattr__(name: str) -> Any:
    if name == "AdaptedEnv":  # the old base class: a one-line way forward instead of a bare ImportError
        raise ImportError("trace_gym.env.adapter.AdaptedEnv is gone (issue 37): write a ForeignEpisode driver "
                          "(begin/act/end/default_tasks/load_task; state/set_state for copy) and wrap it in "
                          "ForeignEnv(driver, snapshot=..., max_turns=...); docs/ecosystem.md shows the migration")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def content_text(content: Any, *, sep: str = "") -> str:
    """A chat message's content from another framework as text: a string as is, the text
    parts of an OpenAI-style content list (mappings or objects with ``type == "text"`` /
    a ``text`` attribute) joined with ``sep`` (each ecosystem joins its own way).

    Raises:
        TypeError: content that is neither, naming its type.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text") if isinstance(part, Mapping) and part.get("type", "text") == "text"
                 else None if isinstance(part, Mapping) else getattr(part, "text", None) for part in content]
        return sep.join(t for t in texts if isinstance(t, str))
    raise TypeError(f"message content must be a str or a list of parts, got {type(content).__name__}")


def query_kwargs(query: str) -> dict[str, Any]:
    """``"size=10&difficulty=hard"`` -> ``{"size": 10, "difficulty": "hard"}`` (values read
    as YAML scalars: numbers, booleans, lists ``[1,2]``).

    Raises:
        ValueError: a part without ``=``, or an empty key, naming it.
    """
    import yaml

    from trace_gym.config import load_yaml

    out: dict[str, Any] = {}
    for part in filter(None, query.split("&")):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"env id options must be key=value joined by '&', got {part!r}")
        try:
            out[key.strip()] = load_yaml(value) if value.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def options_of(kwargs: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    """Refuse keyword arguments an adapter does not take, in one line with did-you-mean."""
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        from trace_gym.utils.suggest import did_you_mean

        near = did_you_mean(unknown[0], list(allowed))
        raise ValueError(f"{where}: unknown option(s) {unknown}{near}; it takes {sorted(allowed)}")
