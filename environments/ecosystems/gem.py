"""GEM (axon-rl's General Experience Maker, PyPI ``gem-llm``) envs under the trace_gym
contract: ``--env gem:<GEM id>[?GEM kwargs]``.

A GEM env is made as GEM makes it, ``gem.make(gem_id, **gem_kwargs)``, then played with
``reset(seed) -> (str, info)`` and ``step(str) -> (str, reward, terminated, truncated,
info)``. :class:`GemEnv` makes a fresh GEM env at every ``reset`` and resets it with the
episode seed, so an episode is a function of (GEM id, kwargs, seed, actions).

Ids: ``gem:<id>`` for any id in GEM's ``ENV_REGISTRY`` (:func:`available`), e.g.
``gem:game:GuessTheNumber-v0-easy``, ``gem:game:Mastermind-v0-hard``; the query sets
keyword arguments of ``gem.make`` (``gem:game:GuessTheNumber-v0-easy?max_number=20``; only
names the GEM env class takes, or its registration sets). The in-process games run
offline; GEM's math, code, QA and eval envs load Hugging Face datasets and Wordle, Hangman
and WordSearch download an NLTK word list, so without the network they fail when made,
in one line. Adapter options are env keyword arguments (``--env-kwargs``): ``snapshot``
(``copy`` or ``replay``) and ``max_turns`` (ours, on top of GEM's own ``max_turns`` kwarg).

Tasks: a GEM game has no dataset; a task is an episode seed. :func:`load_tasks` gives
``Task(id=f"{gem_id}/seed{s}", prompt=<the first observation>, metadata={"seed": s})``
for ``s = seed, ..., seed + n - 1``, and the episode of a task is GEM's
``reset(seed=s)`` (the same secret a GEM user gets with that seed).

## Action Space
``TextAction``: the model's raw text, handed to GEM's ``step`` unchanged (GEM parses it;
the games read the last ``\\boxed{...}``).

## Observation Space
One user message per turn: GEM's observation string, with ``info["prefix"]`` before it and
``info["suffix"]`` (the games' "Enter your next guess.", Hangman's board) after it on a new
line, as GEM's observation wrappers join them. The first observation (the game's
instructions) is a user message too.

## Rewards
GEM's own, every turn. In the games: 1.0 (``LanguageGameReward.success_reward``) on the
winning turn, 0.0 for ordinary and invalid moves, and -0.1 (``format_error_reward``) for
an action GEM cannot parse, which also ends the episode. Some games add partial credit
(Mastermind: each new black peg adds 1/code_length; GuessTheNumber: on its last turn
``1 - |guess - secret| / (max - min)``). trace_gym counts an episode a success when the sum
of its rewards is at least ``trace_gym.tree.SUCCESS_THRESHOLD`` (0.5): a win (1.0) is one,
a format error (-0.1) never is, and so is that partial credit when it reaches 0.5 (a close
last guess, half the pegs), which GEM itself would not call a win.

## Episode End
GEM's ``terminated``/``truncated`` as it returns them (the games set both at their own
``max_turns``); truncated also after our ``max_turns`` steps, and on a step where GEM
raised (``SystemExit`` included), returned a flag that is not a bool or a reward that is
not a number, or gave no reply within ``call_timeout_s`` (``info["env_error"]``;
:class:`~trace_gym.env.boundary.ForeignBoundary`).

## Snapshot
``copy`` (default): a pickled deep copy of the GEM env object (the games' state is plain
Python) with the private global-RNG state. GEM envs draw from the process-global
``random``/``numpy.random`` (``reset(seed)`` calls ``random.seed``), so ``global_rng`` is
set: each :class:`GemEnv` owns generators of its own, which the global functions draw from
on the thread that runs its GEM call (:func:`trace_gym.env.process_state.bind_generators`; no
lock is held across a GEM call, so a hung GEM step holds up no other env, and GEM envs
stepped at once on the agent loop's threads each draw exactly what they draw alone), and
the process's own RNG is never touched; the rest of the process state a GEM call changes
(``gem.make`` configures the root logger) is put back after it. ``replay``: the task, seed
and actions, re-applied to a fresh GEM env (cheaper snapshots of envs that hold large
static data, such as a word list; each restore re-runs the episode's steps).

Not carried over: GEM's vectorised envs (``make_vec``), its wrappers (observation
concatenation, tool wrappers such as ``python_tool``; the agent loop keeps the chat
history itself), ``spawn`` and multi-agent envs.

## Version History
v0: first version (gem-llm 0.1.0).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Mapping, Sequence

from trace_gym.env.adapter import ForeignEnv, options_of

from trace_gym.env.boundary import error_text

from trace_gym.env.process_state import process_state_kept
from trace_gym.utils.targets import load_target
from trace_gym.types import Message, Task

PACKAGE = "gem-llm"
PREFIX = "gem"
ENTRY_POINT = "environments.ecosystems.gem:GemEnv"
TASK_LOADER = "environments.ecosystems.gem:load_tasks"
#: keyword arguments of :class:`GemEnv` an ``--env-kwargs`` may set (``gem_id``/``gem_kwargs`` come from the id)
ENV_OPTIONS = ("snapshot", "max_turns", "few_shot", "call_timeout_s", "max_observation_chars")
#: the episode seed of the ``few_shot`` demonstration (no task loader call uses it by default)
FEW_SHOT_SEED = 987_654_321
#: tasks a ``reset()`` without ``options["task"]`` draws from (seeds 0..DEFAULT_POOL-1)
DEFAULT_POOL = 8
#: longest excerpt of a GEM error put in a one-line message (characters)
MAX_REASON_CHARS = 300

_ANSI = re.compile(r"\x1b\[[0-9;]*m")



def _gem() -> Any:
    """The ``gem`` package, imported with the process state kept."""
    try:
        with process_state_kept():
            import gem
    except ImportError as exc:
        raise ValueError(f"--env {PREFIX}:...: cannot import gem ({exc}); `pip install {PACKAGE}`") from None
    return gem


def _registry() -> Mapping[str, Any]:
    """GEM's ``ENV_REGISTRY`` (id -> ``EnvSpec``)."""
    _gem()
    from gem.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def _one_line(exc: BaseException) -> str:
    """An exception as one short line (GEM's and NLTK's messages span many, with colours)."""
    return " ".join(_ANSI.sub("", error_text(exc)).split())[:MAX_REASON_CHARS]


def _where(gem_id: str) -> str:
    return f"--env {PREFIX}:{gem_id}"


def _spec(gem_id: str) -> Any:
    """GEM's ``EnvSpec`` of ``gem_id``; one line with did-you-mean for an unknown id."""
    registry = _registry()
    if gem_id not in registry:
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"{_where(gem_id)}: not an id in GEM's registry{did_you_mean(gem_id, list(registry))}; "
                         f"`trace-gym envs --ecosystem {PREFIX}` lists its {len(registry)} ids")
    return registry[gem_id]


def make_options(gem_id: str) -> list[str]:
    """The keyword arguments ``gem.make(gem_id, ...)`` takes: the named parameters of its
    env class and the ones its registration sets (GEM classes swallow any other name in
    ``**_``, so it is refused here instead)."""
    spec = _spec(gem_id)
    target = spec.entry_point
    if isinstance(target, str):
        try:
            with process_state_kept():
                target = load_target(target)
        except Exception as exc:  # noqa: BLE001  (whatever GEM's env module needs at import)
            raise ValueError(f"{_where(gem_id)}: cannot import GEM's {spec.entry_point} ({_one_line(exc)})") from None
    params = inspect.signature(target).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return sorted(named | set(spec.kwargs))


def _observation(obs: Any, info: Mapping[str, Any]) -> list[Message]:
    """GEM's observation string and ``info`` prefix/suffix as one user message."""
    if not isinstance(obs, str):
        raise TypeError(f"GEM returned a {type(obs).__name__} observation; this adapter takes text observations")
    prefix, suffix = info.get("prefix"), info.get("suffix")
    text = obs
    if isinstance(suffix, str) and suffix:
        text = (text if not text or text.endswith("\n") else text + "\n") + suffix
    if isinstance(prefix, str):
        text = prefix + text
    return [Message("user", text)]


class GemEpisode:
    """Episodes of one GEM env (a :class:`~trace_gym.env.adapter.ForeignEpisode`): a fresh
    ``gem.make`` per episode, reset with the episode seed; its state, the GEM env object,
    is plain Python (``copy``). Arguments as :class:`GemEnv`'s.

    Raises:
        ValueError: ``gem_kwargs`` that is not a mapping.
    """

    snapshot_strategies = ("copy", "replay")
    global_rng = True

    def __init__(self, gem_id: str = "game:GuessTheNumber-v0-easy", gem_kwargs: Mapping[str, Any] | None = None, *,
                 few_shot: bool = False):
        self.few_shot = bool(few_shot)
        self._demo: list[Message] | None = None
        if gem_kwargs is not None and not isinstance(gem_kwargs, Mapping):
            raise ValueError(f"{_where(gem_id)}: gem_kwargs must be a mapping, got {gem_kwargs!r:.100}")
        self.gem_id, self.gem_kwargs = gem_id, dict(gem_kwargs or {})
        self._pool: list[Task] | None = None
        self.game: Any = None  # the GEM env of the current episode

    @property
    def env_key(self) -> str:
        query = "&".join(f"{k}={v!r}" for k, v in sorted(self.gem_kwargs.items()))
        return f"{PREFIX}:{self.gem_id}" + (f"?{query}" if query else "")

    def prepare(self) -> None:
        """Made once when the env is built, so an env GEM cannot make fails then (under the
        private RNG: a GEM constructor draws from the global RNG, it calls reset())."""
        self._make()

    def _make(self) -> Any:
        gem = _gem()
        _spec(self.gem_id)
        try:
            return gem.make(self.gem_id, **self.gem_kwargs)  # in a boundary call: logging etc. put back after it
        except Exception as exc:  # noqa: BLE001  (a dataset or word list GEM cannot fetch, a bad kwarg)
            raise ValueError(f"{_where(self.gem_id)}: GEM could not make this env ({_one_line(exc)}); the games "
                             "without a word list run offline, the dataset envs need the network") from None

    def default_tasks(self) -> Sequence[Task]:
        # without prompts: asked for at every reset without a task
        if self._pool is None:
            self._pool = [_seed_task(self.gem_id, s) for s in range(DEFAULT_POOL)]
        return self._pool

    def load_task(self, task_id: str) -> Task:
        head, sep, seed = task_id.rpartition("/seed")
        if head != self.gem_id or not sep or not seed.isdigit():
            raise ValueError(f"task id {task_id!r} is not one of {self.gem_id}'s ('{self.gem_id}/seed<N>')")
        return load_tasks(1, int(seed), gem_id=self.gem_id, gem_kwargs=self.gem_kwargs)[0]

    def begin(self, task: Task, seed: int):
        # made afresh under the seeded private RNG: whatever a GEM constructor draws is
        # then a function of the seed too; GEM's reset(seed) seeds random and numpy
        demo = self._demonstration() if self.few_shot else []
        self.game = self._make()
        obs, info = self.game.reset(seed=seed % 2**32)
        info = dict(info or {})
        return [*demo, *_observation(obs, info)], info

    def _demonstration(self) -> list[Message]:
        """The ``few_shot`` turn (made once per instance; a function of the fixed seed)."""
        if self._demo is None:
            game = self._make()
            obs, info = game.reset(seed=FEW_SHOT_SEED)
            action = str(game.sample_random_action())
            after, _reward, _terminated, _truncated, after_info = game.step(action)
            self._demo = [*_observation(obs, dict(info or {})), Message("assistant", action),
                          *_observation(after, dict(after_info or {}))]
        return list(self._demo)

    def act(self, action: str):
        obs, reward, terminated, truncated, info = self.game.step(action)
        info = dict(info or {})
        return _observation(obs, info), reward, terminated, truncated, info  # flags and reward checked by the boundary

    def state(self) -> Any:
        return self.game

    def set_state(self, state: Any) -> None:
        self.game = state

    def end(self) -> None:
        self.game = None


class GemEnv(ForeignEnv):
    """A GEM env under our contract (see the module docstring): a
    :class:`~trace_gym.env.adapter.ForeignEnv` around a :class:`GemEpisode`.

    Args:
        gem_id: an id of GEM's ``ENV_REGISTRY``.
        gem_kwargs: keyword arguments of ``gem.make`` (:func:`make_options` names them).
        snapshot: ``copy`` (default) or ``replay``.
        max_turns: truncate after this many steps (``None``: GEM decides).
        few_shot: start every episode with one demonstrated turn of the same game (a
            GEM episode at :data:`FEW_SHOT_SEED`: its first observation, the well-formed
            action GEM's own ``sample_random_action`` writes, and GEM's answer to it), so a
            small model sees the action format; GEM's dynamics and rewards are unchanged.
        call_timeout_s, max_observation_chars: the boundary's deadline per GEM call
            (seconds) and bound on an observation (characters); see
            :class:`~trace_gym.env.boundary.ForeignBoundary`.

    Raises:
        ValueError: an unknown id, or GEM could not make the env (one line: a dataset or
            word list it cannot fetch offline, a bad kwarg value).
    """

    #: what makes a GEM game easier or harder for a policy (named by the no-contrast warning)
    difficulty_knobs = {
        "few_shot": "env kwarg (--env-kwargs '{\"few_shot\": true}'): one demonstrated turn first; without it "
                    "SmolLM2-135M never writes GEM's \\boxed{} action and every episode ends at reward -0.1 "
                    "(with it, 13 of 16 GuessTheNumber-v0-easy tasks were mixed: docs/ecosystem.md)",
        "the id's level": "GEM registers -easy, -hard and -random variants of a game (trace-gym envs --ecosystem gem)",
        "make kwargs": "the game's own settings in the id's query, e.g. gem:game:GuessTheNumber-v0-easy?max_number=5 "
                       "(GuessTheNumber: min_number, max_number, max_turns)",
    }

    def __init__(self, gem_id: str = "game:GuessTheNumber-v0-easy", gem_kwargs: Mapping[str, Any] | None = None, *,
                 snapshot: str | None = None, max_turns: int | None = None, few_shot: bool = False,
                 call_timeout_s: float | None = None, max_observation_chars: int | None = None):
        super().__init__(GemEpisode(gem_id, gem_kwargs, few_shot=few_shot), snapshot=snapshot, max_turns=max_turns,
                         call_timeout_s=call_timeout_s, max_observation_chars=max_observation_chars)


def _seed_task(gem_id: str, seed: int) -> Task:
    """The task of episode seed ``seed``, without its prompt."""
    return Task(id=f"{gem_id}/seed{seed}", prompt="", source=f"{PREFIX}:{gem_id}", metadata={"seed": seed})


def load_tasks(n: int, seed: int = 0, *, gem_id: str, gem_kwargs: Mapping[str, Any] | None = None) -> list[Task]:
    """``n`` tasks of a GEM env: episode seeds ``seed .. seed + n - 1``, each with the
    episode's first observation as its prompt.

    Raises:
        ValueError: ``n < 1``, or the env cannot be made (:class:`GemEnv`).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    env = GemEnv(gem_id, gem_kwargs)
    tasks = []
    for s in range(seed, seed + n):
        bare = _seed_task(gem_id, s)
        obs, _info = env.reset(options={"task": bare})
        tasks.append(Task(id=bare.id, prompt=obs[0].content, source=bare.source, metadata={"seed": s}))
    env.close()
    return tasks


def family(name: str, options: dict, env_kwargs: dict, task_kwargs: dict):
    """The :class:`~trace_gym.env.family.EnvFamily` of ``gem:<name>?<options>``: ``options``
    are ``gem.make`` keyword arguments, ``env_kwargs`` the adapter's (:data:`ENV_OPTIONS`);
    the task loader takes none of its own.

    Raises:
        ValueError: an id GEM does not register, or an option, env kwarg or task kwarg
            nothing takes (one line each, with did-you-mean).
    """
    from trace_gym.env.family import adapter_family

    spec = _spec(name)
    if options:
        options_of(options, make_options(name), _where(name))
    options_of(env_kwargs, ENV_OPTIONS, f"{_where(name)} env kwargs")
    options_of(task_kwargs, (), f"{_where(name)} task kwargs")
    target = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__name__", "?")
    return adapter_family(PREFIX, name, ENTRY_POINT, env_kwargs={"gem_id": name, "gem_kwargs": dict(options),
                                                                 **env_kwargs},
                          task_loader=TASK_LOADER, loader_kwargs={"gem_id": name, "gem_kwargs": dict(options)},
                          description=f"GEM {name} ({target.rpartition(':')[2]}); a task is an episode seed")


def available() -> list[str]:
    """Every id in GEM's registry, in its order (the games first), with the ``gem:`` prefix;
    the dataset-backed ones need the network when made."""
    return [f"{PREFIX}:{gem_id}" for gem_id in _registry()]
