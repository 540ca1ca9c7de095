"""The running sums of one policy update and their summary (``PolicyTrainer.step``'s metrics)."""

from __future__ import annotations

import math


class UpdateStats:
    """Sums over the rows of one update; :meth:`summary` gives the per-token and
    per-optimizer-step means ``PolicyTrainer.step`` returns."""

    def __init__(self) -> None:
        self.loss = self.pg = self.kl = self.entropy = self.mismatch_abs = self.mismatch_kl = self.is_weight = 0.0
        self.tokens = self.mismatch_tokens = self.clipped_low = self.clipped_high = self.clipped_dual = 0
        self.grad_norms: list[float] = []
        self.optimizer_steps = 1

    def add(self, *, loss, sums, tokens, entropy, mismatch_abs, mismatch_kl, mismatch_tokens, is_weight) -> None:
        self.loss += loss
        self.pg += sums["pg"]
        self.kl += sums["kl"]
        self.clipped_low += sums["clipped_low"]
        self.clipped_high += sums["clipped_high"]
        self.clipped_dual += sums["clipped_dual"]
        self.tokens += tokens
        self.entropy += entropy
        self.mismatch_abs += mismatch_abs
        self.mismatch_kl += mismatch_kl
        self.mismatch_tokens += mismatch_tokens
        self.is_weight += is_weight

    def summary(self) -> dict[str, float]:
        n, m, k = max(self.tokens, 1), max(self.mismatch_tokens, 1), max(self.optimizer_steps, 1)
        return {  # losses: mean over optimizer steps; fractions and means: over every token run
            "loss": self.loss / k, "pg_loss": self.pg / k, "kl": self.kl / k,
            "clip_fraction_low": self.clipped_low / n, "clip_fraction_high": self.clipped_high / n,
            "clip_fraction_dual": self.clipped_dual / n,
            "entropy": self.entropy / n,
            "mismatch_abs": self.mismatch_abs / m if self.mismatch_tokens else math.nan,
            "mismatch_kl": self.mismatch_kl / m if self.mismatch_tokens else math.nan,
            "is_weight_mean": self.is_weight / n if self.is_weight else math.nan,
            "grad_norm": max(self.grad_norms) if self.grad_norms else 0.0,
        }
