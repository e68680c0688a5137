"""What each rank runs in test_compile.py: torch.ops.mmsp's custom ops under torch.library.opcheck,
and a patched model compiled by torch.compile against the same model eager (fp64, real Gloo ranks)."""
import copy
import os
import sys

import torch
import torch.nn.functional as F

from sp_checks import BATCH, CONFIG, ROOT, assert_gradients_equal, batch, hf_batch, meshes, per_sequence  # noqa: F401


def _opcheck(op, args, what):
    # opcheck's tests run the op on every rank in one order (its collectives meet); a failure names the op.
    try:
        torch.library.opcheck(op, args)
    except Exception as error:
        raise AssertionError(f"{what}: opcheck of {op}: {error}") from error


def _same_as_eager(custom, eager, inputs, what):
    """The custom op and mmsp's eager C++ autograd give the same output and input gradients, to the
    last bit (the attention's backward op runs eager's backward; the others recompute the forward:
    the same arithmetic)."""
    results = []
    for call in (custom, eager):
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        out = call(*leaves)
        weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(99), dtype=out.dtype)
        (out * weight).sum().backward()
        results.append([out.detach()] + [x.grad for x in leaves])
    for i, (a, b) in enumerate(zip(*results)):
        assert torch.equal(a, b), f"{what}: {'output' if i == 0 else f'gradient of input {i - 1}'} differs " \
                                  f"from eager mmsp.ops by {(a - b).abs().max().item():.3e}"


def ops_pass_opcheck(rank, world):
    """Every op of torch.ops.mmsp passes torch.library.opcheck (schema, fake implementation,
    autograd registration, AOT dispatch with dynamic shapes) on every dp = 1 mesh of the world,
    on this rank's real shard of the example batch."""
    import mmsp

    b = batch()
    lengths = [len(s["input_ids"]) for s in b["sequences"]]
    for ring, ulysses in meshes(world):
        mesh = mmsp.Mesh(ring=ring, ulysses=ulysses)
        shard = mmsp.plan(CONFIG, b, mesh)
        what = f"ring {ring} x ulysses {ulysses}, rank {rank}"
        names = mesh.op_groups
        seg, order = list(shard.segments), list(shard.orders)
        H_kv = 2 * ulysses
        H, D = 2 * H_kv, 8

        def grad(x):
            return x.requires_grad_()

        q = grad(shard.gather(per_sequence(lengths, H, D, seed=1)))
        k = grad(shard.gather(per_sequence(lengths, H_kv, D, seed=2)))
        v = grad(shard.gather(per_sequence(lengths, H_kv, D, seed=3)))
        split = list(shard.split_slots) if shard.split_slots else []
        _opcheck(torch.ops.mmsp.context_attention.default,
                 (q, k, v, seg, order, names["ring"], names["ulysses"], True, 0.0, split), what)
        # the op's first output is the attention's; the rest are what its backward reads
        _same_as_eager(lambda q_, k_, v_: torch.ops.mmsp.context_attention(q_, k_, v_, seg, order, names["ring"],
                                                                           names["ulysses"], True, 0.0, split)[0],
                       lambda q_, k_, v_: mmsp.ops.attention(q_, k_, v_, shard, mesh), (q, k, v),
                       f"{what}: context_attention")
        saved = torch.ops.mmsp.context_attention(q.detach(), k.detach(), v.detach(), seg, order, names["ring"],
                                                 names["ulysses"], True, 0.0, split)[1:]
        _opcheck(torch.ops.mmsp.context_attention_backward.default,
                 (torch.randn_like(q), list(saved), k.shape[1], seg, order, names["ring"], names["ulysses"], True,
                  0.0, split), what)
        # Ulysses' exchanges on this rank's slots: [T_u, H, F] <-> [sum(T), H/U, F].
        L = q.shape[0]
        tokens = [L] * ulysses
        x = grad(torch.randn(L, 2 * ulysses, 3, dtype=torch.float64))
        _opcheck(torch.ops.mmsp.ulysses_scatter_heads.default, (x, tokens, names["ulysses"]), what)
        _same_as_eager(lambda x_: torch.ops.mmsp.ulysses_scatter_heads(x_, tokens, names["ulysses"]),
                       lambda x_: mmsp.ops.ulysses_scatter_heads(x_, tokens, mesh), (x,), f"{what}: scatter_heads")
        y = grad(torch.randn(L * ulysses, 2, 3, dtype=torch.float64))
        _opcheck(torch.ops.mmsp.ulysses_gather_heads.default, (y, tokens, names["ulysses"]), what)
        # Vision DP's rows: rank p sends p + 1 rows to each rank (uneven, none to itself on ring 1).
        P = ring * ulysses
        me = mesh.coords.ring * ulysses + mesh.coords.ulysses
        send = [me + 1 if p != me or P == 1 else 0 for p in range(P)]
        recv = [p + 1 if p != me or P == 1 else 0 for p in range(P)]
        rows = grad(torch.randn(sum(send), 5, dtype=torch.float64))
        _opcheck(torch.ops.mmsp.all_to_all_v.default, (rows, send, recv, names["context"]), what)
        if ulysses == 1:  # Gated DeltaNet's conv and rule take the ring share (after the head scatter)
            Hg, K, V, Ch, W = 2, 8, 4, 6, 4
            xc = grad(shard.gather(per_sequence(lengths, Ch, seed=5)))
            wc = grad(torch.randn(Ch, W, dtype=torch.float64))
            _opcheck(torch.ops.mmsp.gated_delta_conv.default, (xc, wc, seg, order, names["ring"]), what)
            _same_as_eager(lambda x_, w_: torch.ops.mmsp.gated_delta_conv(x_, w_, seg, order, names["ring"]),
                           lambda x_, w_: mmsp.ops.gated_delta_conv(x_, w_, shard, mesh), (xc, wc),
                           f"{what}: gated_delta_conv")
            qg = grad(F.normalize(shard.gather(per_sequence(lengths, Hg, K, seed=7)), dim=-1))
            kg = grad(F.normalize(shard.gather(per_sequence(lengths, Hg, K, seed=8)), dim=-1))
            vg = grad(shard.gather(per_sequence(lengths, Hg, V, seed=9)))
            g = grad(-torch.rand(qg.shape[0], Hg, dtype=torch.float64))
            beta = grad(torch.rand(qg.shape[0], Hg, dtype=torch.float64))
            _opcheck(torch.ops.mmsp.gated_delta_rule.default, (qg, kg, vg, g, beta, seg, order, names["ring"], 64),
                     what)
            _same_as_eager(lambda *x: torch.ops.mmsp.gated_delta_rule(*x, seg, order, names["ring"], 64),
                           lambda *x: mmsp.ops.gated_delta_rule(*x, shard, mesh), (qg, kg, vg, g, beta),
                           f"{what}: gated_delta_rule")


def compiled_patch_equals_eager(rank, world, family_name, ring, ulysses, backend, whole=False):
    """A patched model whose decoder layers are compiled (torch.compile, `backend`) = the same
    patched model eager: the loss and every parameter's gradient after one step, fp64. The
    compiled layers run mmsp's attention (and Qwen3.5's Gated DeltaNet) as torch.ops.mmsp nodes.
    whole: then torch.compile(model) of the whole patched model too, in the same processes (the
    batch's checks and plan run eagerly inside it: torch.compiler.disable)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
    from transformers.utils import logging

    import families
    import mmsp

    logging.set_verbosity_error()
    torch._dynamo.reset()
    # transformers' norms round fp64 through fp32 (`.to(torch.float32)` and back); inductor keeps
    # the wider value unless told to emulate the casts, which eager rounds.
    torch._inductor.config.emulate_precision_casts = True
    family = families.FAMILIES[family_name]
    base = families.build_model(family).train()
    eager = copy.deepcopy(base)
    mesh = mmsp.Mesh(dp=world // (ring * ulysses), ring=ring, ulysses=ulysses)
    mmsp.patch(eager, mesh)
    samples = families.make_samples(family)
    want = eager(**hf_batch(family, samples)).loss
    want.backward()
    for form in ("layers", "whole") if whole else ("layers",):
        compiled = mmsp.patch(copy.deepcopy(base), mesh)
        seen = set()
        run = torch.compile(compiled, backend=_recording(backend, seen), dynamic=False) if form == "whole" \
            else compiled
        for layer in _decoder_layers(compiled) if form == "layers" else []:  # in place: names unchanged
            layer.compile(backend=_recording(backend, seen), dynamic=False)
        what = (f"{family_name} compiled ({backend}, {form}) on ring {ring} x ulysses {ulysses}, rank {rank}")
        got = run(**hf_batch(family, samples)).loss
        got.backward()
        _assert_compiled_equal(compiled, eager, got, want, seen, backend, family_name, what)


def _assert_compiled_equal(compiled, eager, got, want, seen, backend, family_name, what):
    # aot_eager runs the traced graph's ops as eager does: equal to rounding. Inductor generates
    # its own kernels; transformers' norms compute in fp32 even in an fp64 model, where its
    # vectorised fp32 math may round a last bit apart from eager's, so it is held to fp32's scale.
    loss_rtol, grad_rtol = (1e-12, 1e-11) if backend == "aot_eager" else (1e-8, 1e-6)
    worst = max(((p.grad - r.grad).norm() / r.grad.norm()).item()
                for (_, p), (_, r) in zip(compiled.named_parameters(), eager.named_parameters())
                if r.grad is not None and r.grad.norm() > 0)
    print(what, f"loss {abs(got.item() - want.item()) / abs(want.item()):.2e} relative, worst gradient {worst:.2e}")
    assert abs(got.item() - want.item()) <= loss_rtol * abs(want.item()), \
        f"{what}: loss {got.item()!r} != {want.item()!r}"
    assert_gradients_equal(compiled, eager, what, rtol=grad_rtol)
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    print(what, "graph breaks", breaks, "ops", sorted(t for t in seen if "mmsp" in t))
    want_ops = {"mmsp.context_attention"} if family_name != "qwen3_5" else {"mmsp.gated_delta_rule"}
    assert want_ops <= seen, f"{what}: the compiled layers' graphs hold {sorted(seen)}, not {sorted(want_ops)}"


def _recording(backend, seen):
    """`backend`, noting the ops of every graph it is given (the mmsp ops must be nodes of them)."""
    inner = torch._dynamo.lookup_backend(backend)

    def compile_graph(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return inner(gm, example_inputs)

    return compile_graph


def _decoder_layers(model):
    for path in ("model.language_model.layers", "model.layers", "language_model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        return obj
    raise AssertionError(f"no decoder layers found in {type(model).__name__}")
