"""mmsp.rl: the training half of RL and preference tuning on the mesh (docs/rl.md).

    out = model(**batch, return_token_logprobs=True, return_token_entropy=True, temperature=1.0)
    mask = batch["labels"] != -100
    result = mmsp.rl.policy_loss(out.token_logprobs, old_logprobs, advantages, mask, agg="token-mean",
                                 ref_logprobs=ref, kl_coef=0.001, entropy=out.token_entropy)
    result.loss.backward()                       # = one process on the whole batch

The patched model (mmsp.patch) returns per-token values in the batch's own layout [B, T],
gathered once per step and differentiable; the losses here are written on them.
"""
from mmsp.rl.dpo import dpo_loss, sequence_logps
from mmsp.rl.policy_losses import AGG_MODES, KL_KINDS, PolicyLoss, agg_loss, clipped_surrogate, kl_penalty, policy_loss
from mmsp.rl.token_head import token_head

__all__ = ["AGG_MODES", "KL_KINDS", "PolicyLoss", "agg_loss", "clipped_surrogate", "dpo_loss", "kl_penalty",
           "policy_loss", "sequence_logps", "token_head"]
