"""Policy-gradient losses on per-token log-probs [B, T] (the patched forward's
`token_logprobs`), with verl's and TRL's formulas and names (docs/rl.md).

- `agg_loss(loss_mat, mask, mode)`: how per-token losses become one number — verl's
  `loss_agg_mode`: "token-mean" (over every labelled token of the batch: TRL's "bnpo"/"dapo"),
  "seq-mean-token-mean" (each sequence's mean, then the mean over sequences: TRL's "grpo"),
  "seq-mean-token-sum" (each sequence's sum, then the mean over sequences), and
  "seq-mean-token-sum-norm" (the sums over a constant: Dr. GRPO).
- `kl_penalty(logprobs, ref_logprobs, kind)`: k1 = log p - log p_ref, k2 = (k1)² / 2,
  k3 = e^{-k1} + k1 - 1 (verl's "low_var_kl" and TRL's GRPO KL, clamped as verl clamps it).
- `clipped_surrogate(...)`: PPO's clipped importance ratio, with asymmetric ranges and verl's
  dual clip for negative advantages.
- `policy_loss(...)`: verl's actor objective: the surrogate, plus kl_coef x KL to the reference,
  minus entropy_coef x the entropy, each aggregated by the same mode.

Every function is written on the whole batch's values, so on every mesh it is one process's.
"""
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from mmsp.rl.checks import check_per_token, raise_agreed

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3")


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", *,
             scale_factor: Optional[float] = None) -> torch.Tensor:
    """loss_mat [B, T] -> a scalar over the tokens where mask [B, T] is true (modes: module doc).
    Sequences without a labelled token take no part in the seq-mean modes; "seq-mean-token-sum-norm"
    divides the sum of the sequences' sums by scale_factor (default T, as verl)."""
    if mode not in AGG_MODES:
        raise ValueError(f"mmsp.rl.agg_loss: mode {mode!r} is not one of {', '.join(AGG_MODES)}")
    m = mask.to(loss_mat.dtype)
    summed = (loss_mat * m).sum(-1)  # [B]
    counts = m.sum(-1)
    if mode == "token-mean":
        return summed.sum() / counts.sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        return summed.sum() / (mask.shape[-1] if scale_factor is None else scale_factor)
    per_seq = summed if mode == "seq-mean-token-sum" else summed / counts.clamp(min=1)
    present = (counts > 0).to(loss_mat.dtype)
    return (per_seq * present).sum() / present.sum().clamp(min=1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference (J. Schulman's k1, k2, k3)."""
    if kind == "low_var_kl":
        kind = "k3"
    if kind not in KL_KINDS:
        raise ValueError(f"mmsp.rl.kl_penalty: kind {kind!r} is not one of {', '.join(KL_KINDS)} (or low_var_kl)")
    if kind == "k1":
        return logprobs - ref_logprobs
    if kind == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    kl = torch.clamp(ref_logprobs - logprobs, min=-20, max=20)  # verl's clamps: exact below them
    return torch.clamp(kl.exp() - kl - 1, min=-10, max=10)


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, *,
                      clip_ratio: float = 0.2, clip_ratio_low: Optional[float] = None,
                      clip_ratio_high: Optional[float] = None,
                      clip_ratio_c: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token loss max(-A r, -A clip(r, 1 - low, 1 + high)), r = exp(log p - log p_old)
    (the log-ratio clamped to ±20, as verl); with clip_ratio_c (verl's dual clip, 3.0 there),
    min(that, -A c) where A < 0. advantages [B] (one per sequence) or [B, T]. Returns the loss
    [B, T] and where the clip was active [B, T]."""
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"mmsp.rl: clip_ratio_c {clip_ratio_c} must be above 1 (the dual clip's lower bound)")
    A = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0).exp()
    unclipped, clipped = -A * ratio, -A * torch.clamp(ratio, 1 - low, 1 + high)
    loss = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        loss = torch.where(A < 0, torch.minimum(loss, -A * clip_ratio_c), loss)
    return loss, clipped > unclipped


@dataclass
class PolicyLoss:
    """policy_loss's result: `loss` to backward, and its parts (detached) to log."""
    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: Optional[torch.Tensor]
    entropy: Optional[torch.Tensor]
    clip_fraction: torch.Tensor


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                agg: str = "token-mean", clip_ratio: float = 0.2, clip_ratio_low: Optional[float] = None,
                clip_ratio_high: Optional[float] = None, clip_ratio_c: Optional[float] = None,
                ref_logprobs: Optional[torch.Tensor] = None, kl_coef: float = 0.0, kl_type: str = "k3",
                kl_bias_correction: bool = False, entropy: Optional[torch.Tensor] = None,
                entropy_coef: float = 0.0, scale_factor: Optional[float] = None,
                mesh: Optional[Any] = None) -> PolicyLoss:
    """verl's actor loss (dp_actor.update_policy): agg(clipped surrogate) + kl_coef · agg(KL to
    the reference) − entropy_coef · agg(entropy), every agg by `agg` over `mask` [B, T] (the
    labelled tokens: labels != -100). logprobs, old_logprobs, ref_logprobs, entropy: [B, T];
    advantages [B] or [B, T]. kl_bias_correction: the per-token KL times the importance ratio
    p / p_old (TRL's GRPO use_bias_correction_kl, on by default there; verl has none). Inputs
    are checked first (shapes, finite values where read), on every rank of `mesh` when given
    (then a bad input on one rank is an error on all)."""
    shape = tuple(logprobs.shape)
    errors = [check_per_token("old_logprobs", old_logprobs, shape, mask),
              check_per_token("advantages", advantages, shape, mask, per_row_ok=True),
              check_per_token("mask", mask, shape, None)]
    if kl_coef != 0.0:
        errors.append("ref_logprobs is missing; kl_coef is not 0" if ref_logprobs is None else
                      check_per_token("ref_logprobs", ref_logprobs, shape, mask))
    if entropy_coef != 0.0:
        errors.append("entropy is missing; entropy_coef is not 0 (return_token_entropy=True gives it)"
                      if entropy is None else check_per_token("entropy", entropy, shape, mask))
    raise_agreed(errors, "mmsp.rl.policy_loss", mesh)
    per_token, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_ratio=clip_ratio,
                                           clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                                           clip_ratio_c=clip_ratio_c)
    pg = agg_loss(per_token, mask, agg, scale_factor=scale_factor)
    loss: Union[torch.Tensor, Any] = pg
    kl = ent = None
    if kl_coef != 0.0:
        assert ref_logprobs is not None
        per_token_kl = kl_penalty(logprobs, ref_logprobs, kl_type)
        if kl_bias_correction:
            per_token_kl = per_token_kl * torch.clamp(logprobs - old_logprobs, min=-20.0, max=20.0).exp()
        kl = agg_loss(per_token_kl, mask, agg, scale_factor=scale_factor)
        loss = loss + kl_coef * kl
    if entropy_coef != 0.0:
        assert entropy is not None
        ent = agg_loss(entropy, mask, agg, scale_factor=scale_factor)
        loss = loss - entropy_coef * ent
    return PolicyLoss(loss, pg.detach(), None if kl is None else kl.detach(), None if ent is None else ent.detach(),
                      agg_loss(clipped.to(logprobs.dtype), mask, "token-mean").detach())
