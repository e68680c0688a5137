"""DPO (sigmoid) on sequence log-prob sums, as TRL's DPOTrainer computes it (loss_type="sigmoid"):
loss = mean over pairs of -log σ(β · ((log π(y_w) - log π_ref(y_w)) - (log π(y_l) - log π_ref(y_l))))
with log π(y) the sum of the response's per-token log-probs (`sequence_logps`)."""
from typing import Any, Optional

import torch
import torch.nn.functional as F

from mmsp.rl.checks import check_per_token, raise_agreed


def sequence_logps(token_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] per-token log-probs -> [B]: each sequence's sum over its labelled tokens."""
    return (token_logprobs * mask.to(token_logprobs.dtype)).sum(-1)


def dpo_loss(chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
             ref_rejected_logps: torch.Tensor, *, beta: float = 0.1, mesh: Optional[Any] = None) -> torch.Tensor:
    """The sigmoid DPO loss over P pairs: each argument [P] (sequence sums). Checked first: the
    same number of chosen and rejected sequences, finite values (on every rank of `mesh`)."""
    errors: list[Optional[str]] = []
    if chosen_logps.dim() != 1:
        errors.append(f"chosen_logps has shape {list(chosen_logps.shape)}; it must be [pairs] (sequence sums)")
    elif tuple(rejected_logps.shape) != tuple(chosen_logps.shape):
        errors.append(f"{chosen_logps.shape[0]} chosen sequences but rejected_logps has shape "
                      f"{list(rejected_logps.shape)}: every pair needs both sides")
    else:
        for name, value in (("chosen_logps", chosen_logps), ("rejected_logps", rejected_logps),
                            ("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)):
            errors.append(check_per_token(name, value, tuple(chosen_logps.shape), None))
    raise_agreed(errors, "mmsp.rl.dpo_loss", mesh)
    margin = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean()
