"""The LM head and the per-token log-probability (and entropy) of each label, chunk by chunk.

For N labelled slots of this rank, the logits z = (hidden · Wᵀ + b) / temperature are made a
chunk of tokens at a time and never kept: the forward keeps per token its log-sum-exp and the
mean of z under its distribution, the backward makes each chunk's logits again. Tokens, not
vocabulary blocks: a chunk's rows are whole distributions, so the entropy needs no running sums.
What a token's values are: log p(label) = z[label] - lse(z), and the entropy
H = lse(z) - Σ p·z (p = softmax(z)). Their gradients on the logits:
d log p(label) / dz = onehot(label) - p;  dH / dz = -p ⊙ (z - Σ p·z).
bf16 / fp16 logits are upcast to fp32 for the softmax; fp64 stays fp64.
"""
from typing import Any, Optional

import torch

# Tokens per chunk such that one chunk's fp32 logits take at most 256 MiB (as mmsp train's
# --loss-chunk default, train/loss/chunked_loss.h).
CHUNK_BYTES = 256 << 20


def default_chunk(vocab: int) -> int:
    return max(1, CHUNK_BYTES // (4 * vocab))


def _wide(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], temperature: float) -> torch.Tensor:
    z = torch.nn.functional.linear(h, weight, bias).to(_wide(h))
    return z / temperature if temperature != 1.0 else z


class TokenHead(torch.autograd.Function):
    """(hidden [N, h], weight [V, h], bias [V] or None, labels [N]) -> log p(label) [N], entropy [N],
    and without gradient the extras TRL's fused head reports: the mean logit [N], whether the
    label is the most likely token [N], log Σ p² [N] (all in the wide dtype)."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                labels: torch.Tensor, temperature: float, chunk: int) -> tuple[torch.Tensor, ...]:
        N = hidden.shape[0]
        wide = _wide(hidden)
        # log p, entropy, log-sum-exp, E[z] (the backward's), mean logit, top-1, log Σ p²
        logp, entropy, lse_all, mean_z, mean_logit, top1, log_sum_sq = (hidden.new_zeros(N, dtype=wide)
                                                                          for _ in range(7))
        for first in range(0, N, chunk):
            rows = slice(first, min(N, first + chunk))
            z = _logits(hidden[rows], weight, bias, temperature)
            lse = torch.logsumexp(z, dim=-1)
            log_p = z - lse[:, None]
            p = log_p.exp()
            picked = z.gather(1, labels[rows, None])[:, 0]
            logp[rows] = picked - lse
            ez = (p * z).sum(-1)
            lse_all[rows], mean_z[rows] = lse, ez
            entropy[rows] = lse - ez
            mean_logit[rows] = z.mean(-1)
            top1[rows] = (picked >= z.max(-1).values).to(wide)
            log_sum_sq[rows] = torch.logsumexp(2 * log_p, dim=-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse_all, mean_z)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(mean_logit, top1, log_sum_sq)
        return logp, entropy, mean_logit, top1, log_sum_sq

    @staticmethod
    def backward(ctx: Any, g_logp: Optional[torch.Tensor], g_entropy: Optional[torch.Tensor],
                 *unused: Any) -> tuple[Optional[torch.Tensor], ...]:
        hidden, weight, bias, labels, lse_all, mean_z = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        N = hidden.shape[0]
        wide = lse_all.dtype
        grad_hidden = torch.zeros_like(hidden, dtype=wide) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=wide) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=wide) if bias is not None and ctx.needs_input_grad[2] else None
        for first in range(0, N, chunk):
            rows = slice(first, min(N, first + chunk))
            z = _logits(hidden[rows], weight, bias, temperature)
            p = (z - lse_all[rows, None]).exp()
            dz = torch.zeros_like(z)
            if g_logp is not None:  # (onehot - p) · g
                g = g_logp[rows].to(wide)
                dz -= p * g[:, None]
                dz.scatter_add_(1, labels[rows, None], g[:, None])
            if g_entropy is not None:  # -p (z - E z) · g
                dz -= p * (z - mean_z[rows, None]) * g_entropy[rows].to(wide)[:, None]
            if temperature != 1.0:
                dz /= temperature
            h = hidden[rows].to(wide)
            if grad_hidden is not None:
                grad_hidden[rows] = dz @ weight.to(wide)
            if grad_weight is not None:
                grad_weight += dz.t() @ h
            if grad_bias is not None:
                grad_bias += dz.sum(0)
        return (None if grad_hidden is None else grad_hidden.to(hidden.dtype),
                None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None)


def token_head(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], labels: torch.Tensor,
               temperature: float = 1.0, chunk: Optional[int] = None) -> tuple[torch.Tensor, ...]:
    """TokenHead on N labelled tokens: (log p, entropy, mean logit, is top-1, log Σ p²), each [N]."""
    if not temperature > 0:
        raise ValueError(f"mmsp: temperature {temperature!r} must be positive (the logits are divided by it)")
    chunk = default_chunk(weight.shape[0]) if chunk is None else chunk
    if chunk < 1:
        raise ValueError(f"mmsp: chunk {chunk} must be at least one token")
    return TokenHead.apply(hidden, weight, bias, labels, float(temperature), int(chunk))
