"""The LM critic: a causal LM with a scalar head on the last token (the paper's predictor).

It reads the prompt's head and the history's most recent tokens
(:func:`prompt_head_history_tail`), so neither the prompt nor the latest turn is lost
when a history is long. Listed in :data:`trace_gym.predictor.kinds.PREDICTORS` as ``lm_critic``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from trace_gym.engines.dtypes import DTYPES
from trace_gym.predictor.kinds import Context, _check_targets
from trace_gym.predictor.memory import prompt_key, with_prompt_evidence

#: Backbone dtypes :class:`LMCriticPredictor` takes, and their bytes per parameter.
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class CriticPlan:
    """What an ``lm_critic`` will be, resolved without loading it (``train --dry-run``).

    Attributes:
        model: the backbone's name or folder.
        device, dtype: where and in what its weights live.
        train_backbone: whether the backbone is fine-tuned (else only the head learns).
        parameters: the backbone's parameters, or ``None`` when its architecture is unknown here.
        trainable: parameters the optimiser updates (the head's included).
        memory_bytes: weights, plus gradients and AdamW's two states (all in ``dtype``)
            when the backbone trains; activations and the feature cache not counted.
    """

    model: str
    device: str
    dtype: str
    train_backbone: bool
    parameters: int | None
    trainable: int | None
    memory_bytes: int | None

    def describe(self) -> str:
        """One line: model, device, dtype, trainable parameters, memory."""
        if self.parameters is None:
            size = "size unknown here (no config.json; name it in models.ARCHITECTURES)"
        else:
            size = (f"{self.parameters / 1e9:.2f}B parameters, {self.trainable / 1e6:,.1f}M trainable, "
                    f"~{self.memory_bytes / 2**30:.1f} GiB ({'weights + grads + AdamW' if self.train_backbone else 'weights'}"
                    f", activations not counted)")
        return (f"{self.model} on {self.device} in {self.dtype}, backbone "
                f"{'trained' if self.train_backbone else 'frozen'}; {size}")


def critic_plan(model: str, kwargs: Mapping[str, Any]) -> CriticPlan:
    """The :class:`CriticPlan` of ``LMCriticPredictor(model, **kwargs)`` (defaults as the class)."""
    from trace_gym.models import backbone_parameters, model_config

    device, dtype = str(kwargs.get("device", "cpu")), str(kwargs.get("dtype", "float32"))
    if dtype not in DTYPES:
        raise ValueError(f"predictor_kwargs.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    train_backbone = bool(kwargs.get("train_backbone", False))
    config = model_config(model)
    if config is None:
        return CriticPlan(str(model), device, dtype, train_backbone, None, None, None)
    n = backbone_parameters(config)
    head = int(config.hidden_size) + 1
    per_param = _BYTES[dtype] * (4 if train_backbone else 1)
    return CriticPlan(str(model), device, dtype, train_backbone, n, head + (n if train_backbone else 0),
                      n * per_param + head * 4 * 4)


def prompt_head_history_tail(prompt: Sequence[int], separator: Sequence[int], history: Sequence[int],
                             budget: int) -> list[int]:
    """``prompt[:p] + separator + history[-h:]`` in at most ``budget`` ids (the LM critic's input).

    The prompt keeps its head, in at most half of the room left by the separator unless
    the history needs less; the history keeps its most recent ids in the rest. When
    everything fits, everything is kept. Pass an empty ``separator`` with an empty history.

    Example: prompt of 10 ids, separator of 1, history of 10, budget 12: room 11, the
    prompt keeps its first 5, the history its last 6.

    Raises:
        ValueError: ``budget`` cannot hold the separator and one id of each side.
    """
    room = budget - len(separator)
    if room < (1 if not history else 2):
        raise ValueError(f"budget must hold the separator ({len(separator)} ids) and one id of the prompt and of "
                         f"the history, got {budget}")
    kept_prompt = min(len(prompt), max(room // 2, room - len(history)))
    kept_history = min(len(history), room - kept_prompt)
    return [*prompt[:kept_prompt], *separator, *history[len(history) - kept_history:]]


def _special_tokens_around(tokenizer) -> tuple[list[int], list[int]]:
    """The ids ``tokenizer`` adds before and after a text (e.g. ``([bos], [])``)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for i in range(len(full) - len(bare) + 1):
        if full[i:i + len(bare)] == bare:
            return full[:i], full[i + len(bare):]
    raise ValueError(f"cannot find the text's ids {bare} inside the tokenizer's output {full}")


class LMCriticPredictor:
    """A causal LM with a scalar head on the last token (the paper's critic).

    What it reads: ``Context.text()`` (prompt, blank line, history) when that fits in
    ``max_length`` tokens; otherwise the prompt's first tokens (at most half of the
    budget, more when the history is short), the blank line, and the history's most
    recent tokens in the rest (:func:`prompt_head_history_tail`), so neither the prompt
    nor the latest turn is dropped from a long history (:meth:`input_ids`). A frozen
    backbone's features are cached by a hash of those ids.

    Args:
        model_path: any local causal-LM folder (e.g. the pulled SmolLM2-135M).
        max_length: tokens read per context, special tokens included.
        train_backbone: also fine-tune the LM (else only the head learns).
        lr: AdamW learning rate.
        batch_size: contexts per forward pass.
        device: torch device of the backbone and the head (``"cuda"`` on a GPU machine).
        dtype: the backbone's weights (``"float32"``; ``"bfloat16"`` halves its memory on a
            GPU). The head and the cached features are float32 whatever this is.
        replay_samples: remembered samples replayed beside each update's batch, drawn in
            proportion to their recency weight (the cost of an update grows by this many
            contexts, not with everything seen).
        replay_half_life, replay_capacity, evidence_discount, evidence_strength: the
            memory, as :class:`~trace_gym.predictor.kinds.EmbeddingPredictor`'s.
    """

    def __init__(self, model_path: str, *, max_length: int = 512, train_backbone: bool = False,
                 lr: float = 1e-4, batch_size: int = 16, prior: float = 0.5, device: str = "cpu",
                 dtype: str = "float32", replay_samples: int = 256, replay_half_life: float = 8.0,
                 replay_capacity: int = 20_000, evidence_discount: float = 0.9, evidence_strength: float = 4.0,
                 seed: int = 0):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from trace_gym.predictor.memory import PromptEvidence, ReplayBuffer

        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"
        self._special_before, self._special_after = _special_tokens_around(self.tokenizer)
        self._separator = self.tokenizer("\n\n", add_special_tokens=False)["input_ids"]  # as Context.text()
        self._budget = max_length - len(self._special_before) - len(self._special_after)
        if self._budget < len(self._separator) + 2:
            raise ValueError(f"max_length must leave room for {len(self._special_before) + len(self._special_after)} "
                             f"special tokens, the separator and two tokens, got {max_length}")
        self.backbone = AutoModel.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        self.backbone.requires_grad_(train_backbone)
        self.head = torch.nn.Linear(self.backbone.config.hidden_size, 1).to(device)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.fill_(float(np.log(prior / (1 - prior))))
        params = list(self.head.parameters()) + (list(self.backbone.parameters()) if train_backbone else [])
        self.optimizer = torch.optim.AdamW(params, lr=lr)
        self.train_backbone = train_backbone
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self._features: dict = {}  # hash of the input ids -> last hidden state (frozen backbone only)
        if int(replay_samples) != replay_samples or replay_samples < 0:
            raise ValueError(f"replay_samples must be an integer >= 0, got {replay_samples!r}")
        self.replay_samples = int(replay_samples)
        self.memory = ReplayBuffer(replay_half_life, replay_capacity)
        self.evidence = PromptEvidence(evidence_discount, evidence_strength)
        self._replay_rng = np.random.default_rng(seed)

    def input_ids(self, contexts: Sequence[Context]) -> list[list[int]]:
        """The token ids read per context, each at most ``max_length`` long (see the class)."""
        prompts, prompts_whole = self._ids_within_budget([c.prompt for c in contexts], tail=False)
        histories, histories_whole = self._ids_within_budget([c.history for c in contexts], tail=True)
        specials = len(self._special_before) + len(self._special_after)
        # tokenising text() may differ from the parts' sum at the blank line by a token or two
        near = [i for i, c in enumerate(contexts) if prompts_whole[i] and histories_whole[i] and specials
                + len(prompts[i]) + len(self._separator) * bool(c.history) + len(histories[i]) <= self.max_length + 16]
        joined = dict(zip(near, self.tokenizer([contexts[i].text() for i in near], verbose=False)["input_ids"])) \
            if near else {}
        out = []
        for i, c in enumerate(contexts):
            if i in joined and len(joined[i]) <= self.max_length:
                out.append(joined[i])  # it fits: the text as the tokenizer reads it
            else:
                body = prompt_head_history_tail(prompts[i], self._separator if c.history else [], histories[i],
                                                self._budget)
                out.append([*self._special_before, *body, *self._special_after])
        return out

    def _ids_within_budget(self, texts: list[str], tail: bool) -> tuple[list[list[int]], list[bool]]:
        """Each text's ids (``whole`` True), or its first (``tail`` False) or last ``budget`` ids.

        A long text is tokenised from a window of characters at that end, widened x4 until
        it holds ``budget + 8`` ids; the 8 at the window's cut side are dropped, as the
        window may split a word there. Tokenising is linear in the text, so this keeps a
        long history from costing more than the ids the critic reads.
        """
        need, margin = self._budget, 8
        ids: list[list[int]] = [[] for _ in texts]
        whole = [not t for t in texts]
        window = {i: 8 * need for i, t in enumerate(texts) if t}
        while window:
            rows = list(window)
            chunks = [texts[i][-window[i]:] if tail else texts[i][:window[i]] for i in rows]  # never empty
            for i, chunk, row in zip(rows, chunks, self.tokenizer(chunks, add_special_tokens=False,
                                                                  verbose=False)["input_ids"]):
                if len(chunk) == len(texts[i]):
                    ids[i], whole[i] = row, True
                elif len(row) >= need + margin:
                    ids[i] = row[len(row) - need:] if tail else row[:need]
                else:
                    window[i] *= 4
                    continue
                del window[i]
        return ids, whole

    def __deepcopy__(self, memo: dict) -> "LMCriticPredictor":
        """A copy with its own head and optimizer; a frozen backbone, the tokenizer and the
        feature cache are shared (a bench copies a predictor per strategy and token-budget
        try: copying an 8B backbone each time would not fit in memory)."""
        import copy

        new = type(self).__new__(type(self))
        memo[id(self)] = new
        shared = {"tokenizer"} | (set() if self.train_backbone else {"backbone", "_features"})
        for key, value in self.__dict__.items():
            setattr(new, key, value if key in shared else copy.deepcopy(value, memo))
        return new

    def _hidden(self, ids: list[list[int]]):
        enc = self.tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt").to(self.device)
        return self.backbone(**enc).last_hidden_state[:, -1].float()  # left padding: last is real

    def _hidden_states(self, contexts: Sequence[Context], grad: bool):
        import torch

        ids = self.input_ids(contexts)
        if self.train_backbone:
            with torch.set_grad_enabled(grad):
                return self._hidden(ids)
        # frozen backbone: a context's features never change, so cache them by what is read
        keys = [hashlib.blake2b(np.asarray(row, dtype=np.int64).tobytes(), digest_size=16).digest() for row in ids]
        missing = {k: row for k, row in zip(keys, ids) if k not in self._features}
        if missing:
            with torch.no_grad():
                for k, h in zip(missing, self._hidden(list(missing.values()))):
                    self._features[k] = h
        hidden = torch.stack([self._features[k] for k in keys])
        while len(self._features) > 50_000:
            self._features.pop(next(iter(self._features)))
        return hidden

    def features(self, contexts: Sequence[Context]) -> np.ndarray:
        """The backbone's last-token hidden states (the head's input), shape ``(n, hidden_size)``, float32."""
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(contexts), self.batch_size):
                out.append(self._hidden_states(contexts[i:i + self.batch_size], grad=False).cpu())
        return torch.cat(out).numpy() if out else np.zeros((0, self.backbone.config.hidden_size), np.float32)

    def _logits(self, contexts: Sequence[Context], grad: bool):
        import torch

        hidden = self._hidden_states(contexts, grad)
        with torch.set_grad_enabled(grad):
            return self.head(hidden)[:, 0]

    def predict_head(self, contexts: Sequence[Context]) -> np.ndarray:
        """The critic's own predictions (no prompt evidence), shape ``(len(contexts),)``."""
        import torch

        out = []
        with torch.no_grad():
            for i in range(0, len(contexts), self.batch_size):
                out.append(torch.sigmoid(self._logits(contexts[i:i + self.batch_size], grad=False)))
        return torch.cat(out).double().cpu().numpy() if out else np.zeros(0)

    def predict(self, contexts: Sequence[Context]) -> np.ndarray:
        """The critic's predictions, each prompt's (depth 0) blended with its own evidence."""
        return with_prompt_evidence(self.evidence, contexts, self.predict_head(contexts))

    def observe_outcomes(self, contexts: Sequence[Context], successes: Sequence[float],
                         trials: Sequence[float]) -> None:
        """Keep each prompt's root outcomes as its own evidence."""
        self.evidence.observe([prompt_key(c) for c in contexts], successes, trials)

    def state_dict(self) -> dict[str, Any]:
        """Head, optimiser, memory, evidence, the replay draw's RNG, and a trained backbone."""
        import copy

        state = {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "memory": self.memory.state_dict(), "evidence": self.evidence.state_dict(),
                 "replay_rng": self._replay_rng.bit_generator.state}
        if self.train_backbone:
            state["backbone"] = self.backbone.state_dict()
        return copy.deepcopy(state)  # a snapshot, not the live tensors

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.memory.load_state_dict(state["memory"])
        self.evidence.load_state_dict(state["evidence"])
        self._replay_rng.bit_generator.state = state["replay_rng"]
        if "backbone" in state:
            self.backbone.load_state_dict(state["backbone"])

    def _with_replay(self, contexts, y: np.ndarray, w: np.ndarray):
        """The batch plus up to ``replay_samples`` remembered samples, drawn in proportion to their
        recency-weighted weight (without replacement), so the step's loss estimates the loss over
        everything remembered; the batch then joins the memory."""
        items, old_y, old_w = self.memory.samples()
        self.memory.add(list(contexts), y, w)
        take = min(self.replay_samples, len(old_y))
        if take == 0:
            return list(contexts), y, w
        pick = self._replay_rng.choice(len(old_y), size=take, replace=False, p=old_w / old_w.sum())
        # drawn in proportion to their weight, each stands for total / take of the memory's weight
        return ([*contexts, *(items[i] for i in pick)], np.concatenate([y, old_y[pick]]),
                np.concatenate([w, np.full(take, old_w.sum() / take)]))

    def update(self, contexts, targets, weights=None) -> dict[str, float]:
        """One optimiser step on the batch and a replayed draw from the memory."""
        import time

        import torch

        y, w = _check_targets(contexts, targets, weights)
        start = time.perf_counter()
        self.evidence.tick()
        contexts, y, w = self._with_replay(contexts, y, w)
        total = max(w.sum(), 1e-12)
        self.optimizer.zero_grad()
        loss_sum = 0.0
        for i in range(0, len(y), self.batch_size):
            logits = self._logits(contexts[i:i + self.batch_size], grad=True)
            yt = torch.from_numpy(y[i:i + self.batch_size]).float().to(self.device)
            wt = torch.from_numpy(w[i:i + self.batch_size] / total).float().to(self.device)
            loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, yt, reduction="none") * wt).sum()
            loss.backward()
            loss_sum += float(loss.detach())
        self.optimizer.step()
        return {"loss": loss_sum, "n": float(len(y)), "seconds": time.perf_counter() - start}
