"""The policy trainer: PPO-clip on packed rollout trees, AdamW, and the weight sync to the engine.

One call to :meth:`PolicyTrainer.step` is one policy update (trace-method.md, "One training
step", step 5) on the finished trees of a batch and their per-node advantages
(:mod:`trace_gym.train.advantages`):

1. trees become token segments (:mod:`trace_gym.train.batches`); nodes whose advantage is 0
   contribute exactly zero policy-gradient, so without a KL term they are not run
   (their tokens still count in the loss normalisers, so the loss is unchanged);
2. rows of at most ``micro_batch_tokens`` tokens are packed, each tree edge once;
3. per token ``t`` of a trained node, held by the objective's sequences ``s`` (each leaf's
   path for ``grpo``/``tree_grpo``, its own rollout for ``treerpo``) with advantages
   ``A_s`` and aggregation coefficients ``c_s`` (:func:`~trace_gym.train.batches.node_coefficients`):

   ``r_t = exp(clamp(logp_t - logp_old_t, -20, 20))`` with ``logp_old`` the trainer's own
   log-probabilities at the start of the step (when the step is one epoch over one
   mini-batch, the very same forward pass provides them, detached: ``r_t = 1`` with the
   right gradient, and no extra pass is spent); the log-ratio clamp is verl's;

   ``l_t = -sum_s c_s min(r_t A_s, clip(r_t) A_s) = -(A+_t min(r_t, clip(r_t)) +
   A-_t max(r_t, clip(r_t)))`` with ``clip(r) = clamp(r, 1 - clip_low, 1 + clip_high)``
   and ``A+_t``, ``A-_t`` the sums of ``c_s A_s`` over the positive and the negative
   ``A_s``: PPO-clip per sequence, computed once per token, so opposite-sign leaves
   sharing a prefix never cancel before the clip. With dual-clip (``clip_ratio_c = C``)
   the negative part is ``A-_t min(max(r_t, clip(r_t)), C)``;

   optionally ``l_t *= min(exp(logp_old_t - logp_engine_t), tis_cap)`` (truncated importance
   weight against the engine's sampling log-probabilities, detached; off by default) and
   ``l_t += kl_coef * w_t * (exp(d_t) - d_t - 1)`` with ``d_t = logp_ref_t - logp_t`` (the
   k3 KL estimator to a frozen copy of the initial policy; off by default) and
   ``w_t = sum_s c_s``;

   ``loss = sum_t l_t``, backpropagated per micro-batch (gradients accumulate);
4. gradient clipping to ``max_grad_norm``, one AdamW step per mini-batch, the LR schedule
   (linear warm-up, then constant or cosine) advanced once per policy update.

Log-probabilities use the logits divided by the rollout temperature, as the engine sampled
(top-k / top-p truncation is not reproduced: keep them off when training). The mean
trainer/engine mismatch ``|logp_old - logp_engine|`` is reported every step.

:meth:`PolicyTrainer.sync_weights` pushes the weights to a rollout engine with
``update_weights`` and checks that the engine reports the new version.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from trace_gym.train.batches import (
    LOSS_AGGREGATIONS,
    Row,
    TokenTree,
    build_row,
    node_coefficients,
    plan_rows,
    slot_bases,
)
from trace_gym.config import check_declared, doc
from trace_gym.train.update_stats import UpdateStats
from trace_gym.utils.threads import resolve_threads, torch_threads

LR_SCHEDULES = ("constant", "cosine")
#: |logp - logp_old| is clamped to this before the ratio is taken (verl's value), nats.
LOG_RATIO_CLAMP = 20.0
DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class TrainerConfig:
    """Loss, optimiser and memory settings of the policy update (one help string per field)."""

    lr: float = field(default=1e-6, metadata=doc("AdamW peak learning rate", within="(0, 1]"))
    weight_decay: float = field(default=0.0, metadata=doc("AdamW decoupled weight decay", within="[0, 100]"))
    adam_betas: tuple[float, ...] = field(default=(0.9, 0.999), metadata=doc(
        "AdamW (beta1, beta2)", within="[0, 1)"))
    warmup_steps: int = field(default=0, metadata=doc(
        "policy updates of linear LR warm-up from 0", within="[0, 10000000]"))
    lr_schedule: str = field(default="constant", metadata=doc("after warm-up: constant | cosine"))
    min_lr_ratio: float = field(default=0.0, metadata=doc("cosine floor, as a fraction of lr", within="[0, 1]"))
    max_grad_norm: float = field(default=1.0, metadata=doc(
        "clip the global gradient norm (0: off)", within="[0, 1000000]"))
    clip_low: float = field(default=0.2, metadata=doc("PPO clip: ratio >= 1 - clip_low", within="[0, 1)"))
    clip_high: float = field(default=0.2, metadata=doc(
        "PPO clip: ratio <= 1 + clip_high (DAPO uses 0.28)", within="[0, 1000]"))
    clip_ratio_c: float | None = field(default=None, metadata=doc(
        "dual-clip: a negative advantage's ratio term is capped at this (> 1; verl uses 3.0; null: off)",
        within="(1, 1000000]"))
    loss_aggregation: str = field(default="token-mean", metadata=doc(
        "token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm (Dr. GRPO)"))
    loss_norm_tokens: int = field(default=0, metadata=doc(
        "L of seq-mean-token-sum-norm, a constant (0: train sets the run's generation length, "
        "min(max_turns * max_turn_tokens, max_episode_tokens))", within="[0, 100000000]"))
    tis_cap: float | None = field(default=None, metadata=doc(
        "truncated importance weight cap vs the engine's sampling logprobs (null: off)", within="(0, 1000000]"))
    kl_coef: float = field(default=0.0, metadata=doc(
        "k3 KL penalty to the initial policy (0: off)", within="[0, 1000]"))
    ppo_epochs: int = field(default=1, metadata=doc("passes over the step's batch", within="[1, 1000]"))
    mini_batches: int = field(default=1, metadata=doc(
        "optimizer steps per pass (the batch split by trees)", within="[1, 1000000]"))
    micro_batch_tokens: int = field(default=4096, metadata=doc(
        "tokens per packed forward/backward pass", within="[1, 100000000]"))
    dtype: str = field(default="auto", metadata=doc(
        "autocast dtype: auto (bf16 on a GPU that supports it, else float32) | float32 | bfloat16"))
    gradient_checkpointing: bool = field(default=False, metadata=doc("recompute activations in backward"))
    cpu_threads: int = field(default=0, metadata=doc(
        "torch threads of the update on CPU, set around each update and restored after it "
        "(0: $OMP_NUM_THREADS, else every core; an engine keeps its own count, trace_gym.utils.threads)",
        within="[0, 4096]"))

    def __post_init__(self) -> None:
        check_declared(self, "trainer.")  # every number's declared range (finite), e.g. lr in (0, 1]
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if len(self.adam_betas) != 2:
            raise ValueError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas!r}")
        resolve_threads(self.cpu_threads, "trainer.cpu_threads")


def lr_factor(update: int, *, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float = 0.0) -> float:
    """LR multiplier for policy update ``update`` (0-based).

    Linear warm-up ``(update + 1) / (warmup_steps + 1)`` for the first ``warmup_steps``
    updates, then 1 (``constant``) or a cosine from 1 to ``min_lr_ratio`` over the
    remaining ``total_steps - warmup_steps`` updates.
    """
    if update < warmup_steps:
        return (update + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (update - warmup_steps) / span)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def ppo_clip_loss(logp, old_logp, pos, neg, weights, *, clip_low: float, clip_high: float,
                  clip_ratio_c: float | None = None, is_weights=None, ref_logp=None,
                  kl_coef: float = 0.0) -> tuple[Any, dict[str, Any]]:
    """Token-level PPO-clip loss over per-sequence terms (see the module docstring).

    Args:
        logp: ``[T]`` current log-probabilities (with grad).
        old_logp: ``[T]`` log-probabilities at the start of the step (no grad).
        pos, neg: ``[T]`` the sums of ``c_s A_s`` over the token's sequences with positive
            and with negative advantage (:class:`~trace_gym.train.batches.Coefficients`).
        weights: ``[T]`` ``sum_s c_s``, the token's weight in the aggregated mean (the KL term's).
        clip_ratio_c: dual-clip cap of a negative advantage's ratio term (``> 1``), or ``None``.
        is_weights: ``[T]`` importance weights (detached) or ``None``.
        ref_logp: ``[T]`` reference log-probabilities, needed when ``kl_coef > 0``.

    Returns:
        ``(loss, sums)``: the scalar, and sums for reporting (``pg``, ``kl``; tokens where a
        clip bound was taken: ``clipped_low`` (a negative term below ``1 - clip_low``),
        ``clipped_high`` (a positive term above ``1 + clip_high``), ``clipped_dual`` (a
        negative term above ``clip_ratio_c``)).
    """
    import torch

    ratio = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    gain_pos = torch.minimum(ratio, clipped)  # min(r A, clip(r) A) / A for A > 0
    gain_neg = torch.maximum(ratio, clipped)  # ... for A < 0
    if clip_ratio_c is not None:
        gain_neg = torch.clamp(gain_neg, max=clip_ratio_c)
    pos, neg = pos.to(ratio.dtype), neg.to(ratio.dtype)
    pg = -(pos * gain_pos + neg * gain_neg)
    if is_weights is not None:
        pg = pg * is_weights
    per_token = pg
    kl = None
    if kl_coef:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        delta = ref_logp - logp
        kl = weights.to(ratio.dtype) * (torch.exp(delta) - delta - 1.0)
        per_token = per_token + kl_coef * kl
    loss = per_token.sum()
    with torch.no_grad():
        dual = (neg != 0) & (torch.maximum(ratio, clipped) > clip_ratio_c) if clip_ratio_c is not None else None
        sums = {
            "pg": float(pg.sum()),
            "kl": float(kl.sum()) if kl is not None else 0.0,
            "clipped_low": int(((neg != 0) & (ratio < 1.0 - clip_low)).sum()),
            "clipped_high": int(((pos != 0) & (ratio > 1.0 + clip_high)).sum()),
            "clipped_dual": int(dual.sum()) if dual is not None else 0,
        }
    return loss, sums


def truncated_is_weights(old_logp, sampling_logp, cap: float):
    """``min(exp(old - sampling), cap)``, 1 where the sampling logprob is unknown (NaN)."""
    import torch

    w = torch.exp(old_logp - sampling_logp).clamp(max=cap)
    return torch.where(torch.isnan(sampling_logp), torch.ones_like(w), w).detach()


# ---------------------------------------------------------------------- the trainer
class PolicyTrainer:
    """A causal LM policy trained with :func:`ppo_clip_loss` on packed trees.

    Args:
        model_path: local HF folder of the policy (float32 master weights are kept).
        config: :class:`TrainerConfig`.
        total_steps: planned policy updates (for the cosine schedule).
        temperature: the rollout sampling temperature (0 is treated as 1).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"`` or ``"cuda"``.
        seed: torch seed (dropout-free models are deterministic anyway).
    """

    def __init__(self, model_path: str | Path, config: TrainerConfig = TrainerConfig(), *, total_steps: int = 1,
                 temperature: float = 1.0, device: str = "auto", seed: int = 0):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.loss_aggregation == "seq-mean-token-sum-norm" and not config.loss_norm_tokens:
            raise ValueError("loss_aggregation seq-mean-token-sum-norm (Dr. GRPO) divides by a constant: set "
                             "trainer.loss_norm_tokens (train sets it to the run's generation length)")
        torch.manual_seed(seed)
        self.config = config
        self.device = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                                   else ("cpu" if device == "auto" else device))
        self.model_path = str(model_path)
        from trace_gym.models import quiet_third_party

        quiet_third_party()
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model.config.use_cache = False
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.reference = None
        if config.kl_coef:
            self.reference = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device)
            self.reference.requires_grad_(False).eval()
        self.autocast_dtype = self._autocast_dtype(config.dtype)
        self.temperature = temperature if temperature > 0 else 1.0
        self.total_steps = max(1, int(total_steps))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=tuple(config.adam_betas),
                                           weight_decay=config.weight_decay)
        self.updates = 0  # policy updates done (the LR schedule's clock)
        self._set_lr()
        #: intra-op threads of every update on CPU (None on a GPU: the count does not matter there)
        self.threads = resolve_threads(config.cpu_threads) if self.device.type == "cpu" else None

    def _autocast_dtype(self, name: str):
        import torch

        if name == "float32":
            return None
        if name == "bfloat16":
            return torch.bfloat16
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None  # CPU: float32 (bf16 autocast is slower than fp32 on CPUs without AMX)

    def lr(self) -> float:
        c = self.config
        return c.lr * lr_factor(self.updates, warmup_steps=c.warmup_steps, total_steps=self.total_steps,
                                schedule=c.lr_schedule, min_lr_ratio=c.min_lr_ratio)

    def _set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr()

    # -- forward
    def row_logprobs(self, row: Row, *, model: Any = None, entropy: bool = False):
        """Log-probabilities ``[T]`` of the row's trained tokens (and their entropies)."""
        import torch

        model = model or self.model
        dev = self.device
        keep, inverse = torch.unique(row.predictors, sorted=True, return_inverse=True)
        ctx = torch.autocast(dev.type, dtype=self.autocast_dtype) if self.autocast_dtype else _null()
        with ctx:
            out = model(input_ids=row.input_ids[None].to(dev), position_ids=row.position_ids[None].to(dev),
                        attention_mask=row.attention_mask(dev), logits_to_keep=keep.to(dev), use_cache=False)
        logp_all = torch.log_softmax(out.logits[0].float() / self.temperature, dim=-1)  # [K, V]
        targets = row.input_ids[row.targets].to(dev)
        logp = logp_all[inverse.to(dev), targets]
        ent = None
        if entropy:
            with torch.no_grad():
                ent = -(logp_all.exp() * logp_all).sum(-1)[inverse.to(dev)]
        return logp, ent

    def _rows(self, trees: Sequence[TokenTree]) -> tuple[list[Row], int]:
        c = self.config
        coefficients = node_coefficients(trees, c.loss_aggregation, c.loss_norm_tokens or None)
        # nodes without a policy-gradient term add exactly zero gradient; run them only for a KL term
        trained = [[n.n_policy > 0 and (bool(c.kl_coef) or k.trained) for n, k in zip(t.nodes, coef)]
                   for t, coef in zip(trees, coefficients)]
        base, total = slot_bases(trees)
        plan = plan_rows(trees, trained, c.micro_batch_tokens)
        return [build_row(trees, units, coefficients, base) for units in plan], total

    # -- one policy update
    def step(self, trees: Sequence[TokenTree]) -> dict[str, float]:
        """One policy update on the trees of a batch, on :attr:`threads` CPU threads;
        returns the step's metrics (``seconds``: its wall-clock)."""
        t0 = time.perf_counter()
        with torch_threads(self.threads):
            out = self._step(trees)
        out["seconds"] = time.perf_counter() - t0
        return out

    def _step(self, trees: Sequence[TokenTree]) -> dict[str, float]:
        import torch

        c = self.config
        self._set_lr()
        groups = [list(trees[i::c.mini_batches]) for i in range(c.mini_batches)] if c.mini_batches > 1 else [list(trees)]
        groups = [g for g in groups if g]
        prepared = [self._rows(g) for g in groups]
        reuse_forward = c.ppo_epochs == 1 and len(groups) == 1
        old: list[Any] = []
        if not reuse_forward:  # logprobs at the step start, for every mini-batch
            with torch.no_grad():
                for rows, total in prepared:
                    buf = torch.zeros(total, device=self.device)
                    for row in rows:
                        buf[row.slots.to(self.device)] = self.row_logprobs(row)[0].detach()
                    old.append(buf)
        stats = UpdateStats()
        stats.optimizer_steps = c.ppo_epochs * len(groups)
        for _ in range(c.ppo_epochs):
            for g, (rows, _total) in enumerate(prepared):
                self.optimizer.zero_grad(set_to_none=True)
                self._accumulate(rows, None if reuse_forward else old[g], stats)
                grad_norm = self._clip()
                self.optimizer.step()
                stats.grad_norms.append(grad_norm)
        lr = self.lr()
        self.updates += 1
        self._set_lr()
        out = stats.summary()
        out.update(lr=lr, micro_batches=float(sum(len(r) for r, _ in prepared)),
                   row_tokens=float(sum(len(row) for rows, _ in prepared for row in rows)),
                   trained_tokens=float(sum(len(row.targets) for rows, _ in prepared for row in rows)),
                   policy_tokens=float(sum(t.policy_tokens for t in trees)))
        return out

    def objective(self, trees: Sequence[TokenTree], old_logprobs: Any = None) -> tuple[float, dict[str, Any]]:
        """The loss and its gradient (by parameter name) of one pass over ``trees``, without an
        optimizer step; for tests and diagnostics. ``old_logprobs``: the step-start
        log-probabilities by slot (:func:`~trace_gym.train.batches.slot_bases` order), or ``None``
        for on-policy (ratio 1)."""
        with torch_threads(self.threads):
            return self._objective(trees, old_logprobs)

    def _objective(self, trees: Sequence[TokenTree], old_logprobs: Any) -> tuple[float, dict[str, Any]]:
        import torch

        self.optimizer.zero_grad(set_to_none=True)
        rows, _ = self._rows(trees)
        old = None if old_logprobs is None else torch.as_tensor(old_logprobs, dtype=torch.float32).to(self.device)
        stats = UpdateStats()
        self._accumulate(rows, old, stats)
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.optimizer.zero_grad(set_to_none=True)
        return stats.loss, grads

    def gradients(self, trees: Sequence[TokenTree]) -> dict[str, Any]:
        """The loss gradient of one on-policy pass over ``trees`` (no optimizer step), by
        parameter name; for tests and diagnostics."""
        return self.objective(trees)[1]

    def _accumulate(self, rows: Sequence[Row], old: Any, stats: UpdateStats) -> None:
        """Forward and backward every row; ``old`` holds step-start logprobs by slot, or
        ``None`` to take them from this very pass (detached)."""
        for row in rows:
            if not len(row.targets):
                continue
            logp, ent = self.row_logprobs(row, entropy=True)
            old_logp = logp.detach() if old is None else old[row.slots.to(self.device)]
            self._backward(row, logp, old_logp, ent, stats)

    def _backward(self, row: Row, logp, old_logp, ent, stats: UpdateStats) -> None:
        import torch

        c, dev = self.config, self.device
        samp = row.sampling_logprobs.to(dev)
        isw = truncated_is_weights(old_logp, samp, c.tis_cap) if c.tis_cap else None
        ref = None
        if c.kl_coef:
            with torch.no_grad():
                ref = self.row_logprobs(row, model=self.reference)[0]
        loss, sums = ppo_clip_loss(logp, old_logp, row.pos.to(dev), row.neg.to(dev), row.weights.to(dev),
                                   clip_low=c.clip_low, clip_high=c.clip_high, clip_ratio_c=c.clip_ratio_c,
                                   is_weights=isw, ref_logp=ref, kl_coef=c.kl_coef)
        loss.backward()
        with torch.no_grad():
            known = ~torch.isnan(samp)
            d = (old_logp - samp)[known]
            stats.add(loss=float(loss.detach()), sums=sums, tokens=len(logp), entropy=float(ent.sum()),
                      mismatch_abs=float(d.abs().sum()), mismatch_kl=float((torch.exp(d) - d - 1).sum()),
                      mismatch_tokens=int(known.sum()), is_weight=float(isw.sum()) if isw is not None else 0.0)

    def _clip(self) -> float:
        import torch

        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        if self.config.max_grad_norm:
            return float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])))

    # -- weights
    def named_weights(self) -> Iterator[tuple[str, Any]]:
        """Checkpoint-format (HF) names and detached tensors of every parameter."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def sync_weights(self, engine: Any, version: int) -> float:
        """Push the weights to ``engine`` (``update_weights``); returns the seconds spent.

        Raises ``RuntimeError`` when the engine does not report ``version`` afterwards.
        """
        t0 = time.perf_counter()
        engine.update_weights(self.named_weights(), version)
        if engine.weights_version != version:
            raise RuntimeError(f"weight sync failed: engine reports version {engine.weights_version}, expected {version}")
        return time.perf_counter() - t0

    def score(self, sequences: Sequence[Sequence[int]], start: int = 1) -> list[list[float]]:
        """The policy's log-probabilities (temperature 1) of ``seq[start:]`` per sequence."""
        import torch

        out = []
        with torch.no_grad():
            for seq in sequences:
                ids = torch.tensor([list(seq)], device=self.device)
                logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
                out.append(lp[start - 1:].tolist())
        return out

    def save(self, folder: str | Path) -> None:
        """HF weights + tokenizer in ``folder/policy``; optimizer and schedule in ``folder/trainer.pt``."""
        import torch

        folder = Path(folder)
        self.model.save_pretrained(folder / "policy", safe_serialization=True)
        self.tokenizer.save_pretrained(folder / "policy")
        torch.save({"optimizer": self.optimizer.state_dict(), "updates": self.updates}, folder / "trainer.pt")

    def load_state(self, folder: str | Path) -> None:
        """Restore the optimizer and schedule saved by :meth:`save` (weights come from
        constructing the trainer on ``folder/policy``)."""
        import torch

        state = torch.load(Path(folder) / "trainer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self._set_lr()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
