"""Qwen3.5's Gated DeltaNet layers under mmsp.patch: transformers' Qwen3_5GatedDeltaNet.forward
on this rank's slots, sequence-parallel. The projections run here; the key heads spread over
Ulysses (mmsp.ops.ulysses_scatter_heads), the conv and the gated delta rule over the ring share
with state passing (mmsp.ops), the heads gathered back, then the gated norm and the output
projection."""

import types
from typing import Any

import torch
import torch.nn.functional as F

from mmsp import op_agreement as _agreement
from mmsp import ops as _ops
from mmsp.transformers_patch.state import current_step

# Qwen3.5's and Qwen3.5-MoE's (the same layer, copied by transformers' modular files)
CLASS_NAMES = ("Qwen3_5GatedDeltaNet", "Qwen3_5MoeGatedDeltaNet")


def linear_layers(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if type(m).__name__ in CLASS_NAMES]


def install(layers: list[Any]) -> None:
    for m in layers:
        m.forward = types.MethodType(gated_deltanet_forward, m)


def gated_deltanet_forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
    if torch.compiler.is_compiling():  # the ops' kernels read the step's agreement at run time
        return _forward(self, hidden_states)
    with _agreement.agreed():  # the patched step was agreed once (its batch check); also in a recompute
        return _forward(self, hidden_states)


def _forward(self, hidden_states):
    step = current_step("a Gated DeltaNet layer")
    shard, mesh = step.shard, step.mesh
    x = hidden_states[0]  # [L, hidden]
    L = x.shape[0]
    Hk, K, V = self.num_k_heads, self.head_k_dim, self.head_v_dim
    rep, U = self.num_v_heads // Hk, mesh.ulysses_size
    q, k, v = torch.split(self.in_proj_qkv(x), [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    b, a = self.in_proj_b(x), self.in_proj_a(x)
    # Per key head, what travels: [q K | k K | v rep·V | b rep | a rep] (value heads h·rep.. belong to key head h).
    mixed = torch.cat([q.view(L, Hk, K), k.view(L, Hk, K), v.view(L, Hk, rep * V), b.view(L, Hk, rep),
                       a.view(L, Hk, rep)], dim=-1)
    heads = Hk // U
    first = mesh.coords.ulysses * heads
    m = _ops.ulysses_scatter_heads(mixed, [L] * U, mesh)  # [T_r, Hk/U, F]: the ring rank's share
    T = m.shape[0]
    q, k, v, b, a = torch.split(m, [K, K, rep * V, rep, rep], dim=-1)
    w = self.conv1d.weight.squeeze(1)  # [q | k | v channels, W]
    w_heads = torch.cat([w[first * K:(first + heads) * K], w[self.key_dim + first * K:self.key_dim + (first + heads) * K],
                         w[2 * self.key_dim + first * rep * V:2 * self.key_dim + (first + heads) * rep * V]])
    qkv = _ops.gated_delta_conv(torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1), w_heads,
                                shard, mesh)
    q = _l2norm(qkv[:, :heads * K].reshape(T, heads, K)).repeat_interleave(rep, 1)
    k = _l2norm(qkv[:, heads * K:2 * heads * K].reshape(T, heads, K)).repeat_interleave(rep, 1)
    v = qkv[:, 2 * heads * K:].reshape(T, heads * rep, V)
    hv = slice(first * rep, (first + heads) * rep)
    beta = b.reshape(T, heads * rep).sigmoid()
    g = -self.A_log[hv].float().exp() * F.softplus(a.reshape(T, heads * rep).float() + self.dt_bias[hv])
    o = _ops.gated_delta_rule(q, k, v, g.to(q.dtype), beta, shard, mesh)  # [T_r, Hv/U, V]
    o = _ops.ulysses_gather_heads(o, [L] * U, mesh)  # [L, Hv, V]
    z = self.in_proj_z(x).reshape(-1, V)
    o = self.norm(o.reshape(-1, V), z).reshape(1, L, -1)
    return self.out_proj(o)


def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)  # fla's and transformers' l2norm
