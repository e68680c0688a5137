"""Mixture-of-experts models under mmsp.patch (Qwen3-VL-MoE, Qwen3.5-MoE): transformers' own
sparse blocks run on this rank's slots, and two things the whole step needs.

Expert parallelism, when the mesh has an expert axis (mmsp.Mesh(..., expert=E), blocks of E
consecutive ranks): each rank of an expert group runs its block of num_experts / E experts on
the (token, expert) rows of every rank of the group, brought by an all-to-all-v (after one of
the counts) and sent back the same way; dropless, each token's outputs summed in the experts'
order, as transformers' loop does. The weights stay whole on every rank (or FSDP2's shards):
a rank leaves the other experts' gradients at zero, and the sum over the world (the patch's,
or FSDP2's reduce-scatter) gives each expert its tokens' gradient, as on one process.

The auxiliary load-balancing loss (the text config's output_router_logits): transformers'
load_balancing_loss_func over the whole step — every sparse layer's router logits of every
rank's real slots (padding left out, as a padded batch's attention mask does) — added to
the loss times router_aux_loss_coef. Each rank adds its share, coef · E / N² · Σ_e C_e · P_e:
C_e the step's picks of expert e (summed over the world first, no gradient), P_e its
probabilities summed over this rank's slots, N the step's real tokens times the sparse layers.
"""

import types
from typing import Any, Optional

import torch

from mmsp._extension import C
from mmsp.transformers_patch.state import current_step, running_step

EXPERTS = ("Qwen3VLMoeTextExperts", "Qwen3_5MoeExperts")
ROUTERS = ("Qwen3VLMoeTextTopKRouter", "Qwen3_5MoeTopKRouter")


def install(model: torch.nn.Module, mesh: Any) -> bool:
    """Installs expert parallelism (when the mesh has an expert axis) and the aux loss's
    router hooks; whether the model has experts. Checks before any collective."""
    experts = [m for m in model.modules() if type(m).__name__ in EXPERTS]
    degree = mesh.sizes.get("expert", 1)
    if not experts:
        if degree > 1:
            raise ValueError(f"mmsp.patch: the mesh splits experts over expert = {degree} ranks, but "
                             f"{type(model).__name__} has no mixture-of-experts layer; use expert=1")
        return False
    total = experts[0].num_experts
    if total % degree:
        raise ValueError(f"mmsp.patch: expert = {degree} must divide num_experts ({total}): each rank of an "
                         "expert group runs the same number of every layer's experts")
    if degree > 1:
        for m in experts:
            m.forward = types.MethodType(_expert_parallel_forward, m)
    for m in model.modules():
        if type(m).__name__ in ROUTERS:
            m.register_forward_hook(_keep_router_logits)
    return True


def _keep_router_logits(module: torch.nn.Module, args: Any, output: Any) -> None:
    step = running_step()
    if step is not None and step.routers is not None and step.routers.open:
        step.routers.logits.append(output[0])


def _local_experts(self, rows: torch.Tensor, counts: list[int], first: int, local: int) -> torch.Tensor:
    """Experts first .. first + local - 1 on the rows received ([source][local expert]
    blocks, each in token order): their outputs, in the order received."""
    starts, at = [], 0
    for c in counts:
        starts.append(at)
        at += c
    sources = len(counts) // local
    # One view each of this rank's experts: one gradient for the block in the backward.
    gate_up = self.gate_up_proj.narrow(0, first, local).unbind(0)
    down = self.down_proj.narrow(0, first, local).unbind(0)
    outputs, placed = [], []
    for j in range(local):
        index = torch.cat([torch.arange(starts[s * local + j], starts[s * local + j] + counts[s * local + j])
                           for s in range(sources)]).to(rows.device)
        x = rows.index_select(0, index)
        gate, up = torch.nn.functional.linear(x, gate_up[j]).chunk(2, dim=-1)
        outputs.append(torch.nn.functional.linear(self.act_fn(gate) * up, down[j]))
        placed.append(index)
    order = torch.cat(placed)
    return torch.cat(outputs).index_select(0, torch.argsort(order))


def _expert_parallel_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    mesh = current_step("a mixture-of-experts layer").mesh
    group = mesh.groups["expert"]
    assert group is not None, "installed for an expert group of more than one rank"
    ranks = group.size
    local = self.num_experts // ranks
    first = group.rank * local
    tokens, k = top_k_index.shape
    picked = top_k_index.reshape(-1)
    token_of = torch.arange(tokens, device=picked.device).repeat_interleave(k)
    order = torch.argsort(picked * tokens + token_of)  # by expert, then token: distinct keys
    rows = hidden_states.index_select(0, token_of[order])
    counts = torch.bincount(picked, minlength=self.num_experts).cpu()
    got = C.all_to_all_v(counts.view(-1, 1), [local] * ranks, [local] * ranks, group).view(-1).tolist()
    sent = counts.view(ranks, local).sum(1).tolist()
    received = [sum(got[s * local:(s + 1) * local]) for s in range(ranks)]
    arrived = C.all_to_all_v(rows, sent, received, group)
    back = C.all_to_all_v(_local_experts(self, arrived, got, first, local), received, sent, group)
    weighted = back * top_k_weights.reshape(-1).index_select(0, order)[:, None]
    return torch.zeros_like(hidden_states).index_add(0, token_of[order], weighted.to(hidden_states.dtype))


def aux_share(model: torch.nn.Module, router_logits: list[torch.Tensor], real: torch.Tensor,
              world: Optional[Any]) -> Optional[torch.Tensor]:
    """This rank's share of router_aux_loss_coef times the step's auxiliary loss (module doc),
    with its gradient; None when the model adds none. `real`: this rank's non-padding slots."""
    config: Any = model.config
    text = config.get_text_config()
    if not getattr(text, "output_router_logits", False) or not router_logits:
        return None
    experts, top_k = text.num_experts, text.num_experts_per_tok
    picks, probs = [], []
    for logits in router_logits:
        p = torch.softmax(logits[real], dim=-1)  # transformers': in the logits' dtype
        picks.append(torch.bincount(torch.topk(p, top_k, dim=-1).indices.reshape(-1), minlength=experts))
        probs.append(p.sum(0))
    counts = torch.cat([torch.stack(picks).sum(0).to(torch.float64),
                        torch.tensor([float(real.numel())], dtype=torch.float64, device=real.device)])
    if torch.is_grad_enabled() and not probs[0].requires_grad and any(p.requires_grad for p in model.parameters()):
        raise ValueError("mmsp.patch: the router logits carry no gradient (reentrant activation checkpointing?), "
                         "which the auxiliary loss needs; use gradient_checkpointing_kwargs={'use_reentrant': False}")
    if world is not None:
        C.all_reduce_(counts, world)
    n = counts[-1] * len(router_logits)
    coef = text.router_aux_loss_coef * experts / (n * n)
    return (coef * counts[:-1]).to(probs[0].dtype) @ torch.stack(probs).sum(0)
