"""Triton entmax attention (asentmax.ops.triton) vs the dense fp64 reference, forward, aux and all gradients.

Runs the kernels under TRITON_INTERPRET=1 on the CPU (CI) on tiny awkward shapes; the same checker runs at
real sizes on the GPU in test_triton_attention_gpu.py. Tolerances are relative: the kernel's error vs
the fp64 reference may be at most C times the error of the reference run in the input dtype, plus a small
floor. Every buffer the kernels allocate is NaN-poisoned, so an unwritten element fails.
"""

import functools
import math
import os

import pytest
import torch

from asentmax.ops.attention import entmax_attention
from asentmax.ops.entmax import _gate, entmax

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests: run with TRITON_INTERPRET=1 (GPU: *_gpu.py)")

FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def make_inputs(case, device="cpu", scale_inputs=1.0, seed=0):
    """Random inputs (leaf tensors requiring grad) for one case dict."""
    gen = torch.Generator().manual_seed(seed)
    b, h, hkv, nq, nk, d = case["B"], case["H"], case["Hkv"], case["Nq"], case["Nk"], case["D"]
    dtype = case["dtype"]

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * scale_inputs).to(device=device, dtype=dtype)

    q, k, v = rand(b, h, nq, d), rand(b, hkv, nk, d), rand(b, hkv, nk, d)
    options = dict(alpha=case["alpha"], causal=case["causal"])
    if case.get("alibi"):
        slopes = torch.tensor([1.0 / (i + 1) if i < h // 2 else 0.0 for i in range(h)])  # NAPE
        if case["alibi"] == "batch":
            slopes = slopes[None].repeat(b, 1) * torch.rand(b, 1, generator=gen).add(0.5)
        options["alibi_slopes"] = slopes.to(device)
    if case.get("q_scale"):
        options["q_scale"] = (1.0 + torch.rand(b, h, nq, generator=gen)).to(device=device, dtype=dtype)
    if case.get("kpm"):
        mask = torch.rand(b, nk, generator=gen) > 0.3
        mask[0, : nk // 2 + 1] = False  # rows of batch 0 whose causal window is all padding
        if b > 1:
            mask[1] = False  # a batch whose every row has no visible key
        options["key_padding_mask"] = mask.to(device)
    tensors = [q, k, v] + ([options["q_scale"]] if "q_scale" in options else [])
    for x in tensors:
        x.requires_grad_(True)
    return q, k, v, options, tensors


def run_attention(q, k, v, options, tensors, d_out, backend, dtype=None, device=None):
    """(out, tau, support, grads) of entmax_attention, inputs cast to `dtype` and moved to `device`."""
    cast = [x.detach().to(device=device or x.device, dtype=dtype or x.dtype).requires_grad_(True)
            for x in tensors]
    opts = {name: x.to(device or x.device) if isinstance(x, torch.Tensor) else x
            for name, x in options.items()}
    if "q_scale" in opts:
        opts["q_scale"] = cast[3]
    out, aux = entmax_attention(*cast[:3], backend=backend, return_aux=True, **opts)
    grads = torch.autograd.grad(out, cast, d_out.to(out))
    return out, aux.tau, aux.support_size, grads


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item()


class _FlashConventionAttention(torch.autograd.Function):
    """out = entmax(z) @ v densely, with the backward FlashAttention and the fused kernels use: delta =
    rowsum(dO * o2), o2 = (g @ v) / sum g saved by the forward (g = p^(2-alpha), softmax: g = p), rather
    than from the same dp = dO @ v^T that dz = g (dp - delta) subtracts it from."""

    @staticmethod
    def forward(ctx, z, v, alpha, empty):
        p = torch.softmax(z, -1) if alpha == 1.0 else entmax(z, alpha=alpha, dim=-1)
        p = p.masked_fill(empty, 0.0)
        g = _gate(p, alpha)  # p^(2-alpha) on the support (softmax: p)
        total = g.sum(-1, keepdim=True)
        o2 = (g @ v) / torch.where(total > 0, total, 1.0)
        ctx.save_for_backward(p, g, v, o2)
        return p @ v

    @staticmethod
    def backward(ctx, d_out):
        p, g, v, o2 = ctx.saved_tensors
        delta = (d_out * o2).sum(-1, keepdim=True)
        dz = g * (d_out @ v.transpose(-1, -2) - delta)
        return dz, p.transpose(-1, -2) @ d_out, None, None


def flash_convention_grads(tensors, options, d_out):
    """Gradients of entmax attention for `tensors` (q, k, v[, q_scale]) computed in fp32 on the CPU with the
    flash convention's delta (_FlashConventionAttention): the same-dtype reference of a kernel of that kind
    where dp - delta cancels (nearly one-hot rows)."""
    from asentmax.ops.reference import reference_logits

    leaves = [x.detach().cpu().float().requires_grad_(True) for x in tensors]
    q, k, v = leaves[:3]
    cpu = {name: options[name].cpu() if name in options else None
           for name in ("alibi_slopes", "key_padding_mask")}
    z, empty = reference_logits(q, k, causal=options["causal"], scale=q.shape[-1] ** -0.5,
                                q_scale=leaves[3] if len(leaves) == 4 else None, **cpu)
    v = v.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    out = _FlashConventionAttention.apply(z, v, options["alpha"], empty)
    return torch.autograd.grad(out, leaves, d_out.cpu().float())


def check_case(case, device="cpu", scale_inputs=1.0, fwd_factor=2.0, bwd_factor=3.0, flash_grads=False):
    """Forward, aux and gradients of the triton backend vs the fp64 reference, errors bounded relative to the
    reference run in the input dtype. flash_grads: the gradients that subtract delta (dq, dk, dq_scale) are
    bounded relative to flash_convention_grads instead (inputs x100: nearly one-hot rows)."""
    q, k, v, options, tensors = make_inputs(case, device, scale_inputs)
    gen = torch.Generator().manual_seed(1)
    d_out = torch.randn(q.shape, generator=gen).to(device)
    with poisoned_allocations():
        out, tau, support, grads = run_attention(q, k, v, options, tensors, d_out, "triton")
    # the references run on the CPU: an oracle independent of the GPU code paths
    ref = run_attention(q, k, v, options, tensors, d_out, "reference", torch.float64, "cpu")
    low = run_attention(q, k, v, options, tensors, d_out, "reference", device="cpu")
    low_grads = list(low[3])
    if flash_grads:
        flash = flash_convention_grads(tensors, options, d_out.to(q.dtype))
        low_grads = [g if i == 2 else f for i, (g, f) in enumerate(zip(low_grads, flash, strict=True))]
    out, tau, support, grads = out.cpu(), tau.cpu(), support.cpu(), [g.cpu() for g in grads]
    floor = FLOOR[case["dtype"]]

    def assert_close(name, x, r, lo, factor):
        assert torch.isfinite(x).all(), f"{name}: non-finite values"
        allowed = factor * max_err(lo, r) + floor * max(1.0, r.abs().max().item())
        assert max_err(x, r) <= allowed, f"{name}: error {max_err(x, r):.3g} > allowed {allowed:.3g}"

    assert_close("out", out, ref[0], low[0], fwd_factor)
    names = ("dq", "dk", "dv", "dq_scale")[: len(grads)]
    for name, g, r, same_dtype, lo in zip(names, grads, ref[3], low[3], low_grads, strict=True):
        assert g.shape == r.shape and g.dtype == same_dtype.dtype, f"{name}: shape or dtype differs"
        assert_close(name, g, r, lo, bwd_factor)

    empty = torch.isinf(ref[1])
    assert torch.equal(torch.isinf(tau), empty), "tau must be +inf exactly on rows with no visible key"
    assert torch.equal(support[empty], torch.zeros_like(support[empty]))
    assert (out[empty.nonzero(as_tuple=True)] == 0).all(), "rows with no visible key must output 0"
    tau_tol = 1e-4 if case["dtype"] == torch.float32 else 1e-3
    assert max_err(tau[~empty], ref[1][~empty]) <= tau_tol * max(1.0, ref[1][~empty].abs().max().item())
    if case["alpha"] == 1.0:  # softmax: every visible key, exactly
        assert torch.equal(support.long(), ref[2].long()), "softmax support must count every visible key"
    # entmax support sizes may differ only for keys whose weight is within rounding of 0
    support_gap = (support.long() - ref[2].long()).abs().max().item()
    assert support_gap <= max(1, int(0.02 * ref[2].max().item())), f"support sizes differ: {support_gap}"


class poisoned_allocations:
    """Within the block, torch.empty / empty_like return NaN-filled (or -1-filled integer) tensors."""

    def __enter__(self):
        self.empty, self.empty_like = torch.empty, torch.empty_like

        def fill(x):
            return x.fill_(float("nan") if x.is_floating_point() else -1)

        torch.empty = lambda *a, **kw: fill(self.empty(*a, **kw))
        torch.empty_like = lambda *a, **kw: fill(self.empty_like(*a, **kw))

    def __exit__(self, *exc):
        torch.empty, torch.empty_like = self.empty, self.empty_like


def case_id(case):
    flags = [name for name in ("alibi", "q_scale", "kpm") if case.get(name)]
    return (f"a{case['alpha']}-{'causal' if case['causal'] else 'full'}-Nq{case['Nq']}-Nk{case['Nk']}"
            f"-D{case['D']}-H{case['H']}/{case['Hkv']}-{str(case['dtype'])[6:]}"
            + "".join("-" + f for f in flags))


def C(alpha, causal, nq, nk, d, dtype=torch.float32, B=1, H=2, Hkv=2, **flags):
    return dict(alpha=alpha, causal=causal, Nq=nq, Nk=nk, D=d, dtype=dtype, B=B, H=H, Hkv=Hkv, **flags)


# bf16 runs on the GPU only: the triton 3.6 interpreter's tl.dot on bf16 operands returns garbage.
INTERPRETER_CASES = [
    C(1.5, True, 1, 1, 16),
    C(1.5, False, 17, 17, 48, H=4, Hkv=2, alibi="heads", q_scale=True),
    C(2.0, True, 63, 63, 16, B=2, kpm=True),
    C(1.25, True, 17, 63, 16, B=2, alibi="batch", q_scale=True),
    C(1.5, True, 130, 130, 16, dtype=torch.float16, H=4, Hkv=1, alibi="heads"),
    C(1.0, True, 63, 63, 48, B=2, H=4, Hkv=2, alibi="heads", q_scale=True, kpm=True),
    C(1.5, True, 1, 130, 16, dtype=torch.float16, B=2, kpm=True, q_scale=True),
    C(1.75, False, 17, 130, 48, alibi="heads", kpm=True, B=2),
    C(1.5, False, 17, 33, 100, alibi="heads", q_scale=True),
    # a cache offset (Nq < Nk), whole 64 x 32 tiles left of the diagonal: the unmasked loops of every kernel
    C(1.5, True, 70, 200, 100, B=2, H=4, Hkv=2, alibi="heads", q_scale=True, kpm=True),
    C(3.0, True, 17, 17, 16, q_scale=True),  # alpha > 2: the triton backend hands over to the chunked one
]


@pytest.mark.parametrize("case", INTERPRETER_CASES, ids=case_id)
def test_triton_matches_reference(case):
    check_case(case)


def test_head_dim_above_kernel_limit_uses_chunked(monkeypatch):
    """head_dim above what the kernels support (tiles would outgrow shared memory): the dispatcher sends
    the triton backend's call to the chunked backend instead of launching the kernels."""
    from asentmax.ops import triton as triton_package
    from asentmax.ops.triton import attention as triton_attention

    def no_kernels(*args, **kwargs):
        raise AssertionError("the fused kernels were launched")

    monkeypatch.setattr(triton_attention, "entmax_attention_fwd", no_kernels)
    monkeypatch.setattr(triton_attention, "entmax_attention_decode", no_kernels)
    check_case(C(1.5, True, 5, 9, triton_package.SUPPORT.max_head_dim + 44, q_scale=True))


def test_rows_sum_to_one():
    """With v = 1 every output entry is sum_j p_j: 1 on rows with a visible key, 0 on the others."""
    case = C(1.5, True, 63, 63, 16, B=2, alibi="heads", q_scale=True, kpm=True)
    q, k, v, options, _ = make_inputs(case)
    out, aux = entmax_attention(q, k, torch.ones_like(v), backend="triton", return_aux=True, **options)
    empty = torch.isinf(aux.tau)
    assert torch.allclose(out[~empty], torch.ones(()), atol=1e-3)
    assert (out[empty] == 0).all()


def test_exact_zeros_and_tile_skipping():
    """Strong ALiBi makes far tiles all-zero: their weights are exactly 0 and the result still matches."""
    case = C(1.5, True, 130, 130, 16, H=2, Hkv=2, alibi="heads")
    q, k, v, options, _ = make_inputs(case)
    options["alibi_slopes"] = torch.tensor([4.0, 2.0])
    out, aux = entmax_attention(q, k, v, backend="triton", return_aux=True, **options)
    ref, ref_aux = entmax_attention(q.double(), k.double(), v.double(), backend="reference", return_aux=True,
                                    **options)
    assert aux.support_size.max() < 20
    assert max_err(out, ref) < 1e-5
    # the precondition of the skipping: some causally visited (64 x 64) tiles are dead for their query block
    from asentmax.ops.triton.attention_common import forward_blocks
    from asentmax.ops.triton.attention_fwd import entmax_attention_fwd

    blocks = forward_blocks(16, 130)
    _, _, tau, _, _, tile_max, _ = entmax_attention_fwd(
        q, k, v, mode=1, alpha=1.5, scale=0.25, causal=True, slopes=options["alibi_slopes"][None].expand(1, 2)
        .contiguous(), q_scale=None, kpm=None, write_o2=False, tol=1e-3, max_iter=40, blocks=blocks)
    assert tile_max[:, :, 2, 0].le(tau[:, :, 128:].amin(-1)).all()  # rows 128-129 vs keys 0-63
    assert math.isclose(aux.tau[0, 0, -1].item(), ref_aux.tau[0, 0, -1].item(), abs_tol=1e-5)


@pytest.mark.parametrize("case", [C(1.5, True, 1, 1100, 16, B=2, H=4, Hkv=2, alibi="heads", q_scale=True,
                                    kpm=True),
                                  C(1.0, False, 5, 130, 48, dtype=torch.float16, q_scale=True),
                                  C(1.25, True, 3, 63, 16, B=2, kpm=True)], ids=case_id)
def test_decoding_path_forward(case):
    """Nq <= 16 without gradients takes the split-over-keys decoding kernels (attention_decode.py)."""
    q, k, v, options, _ = make_inputs(case)
    with torch.no_grad(), poisoned_allocations():
        out, aux = entmax_attention(q, k, v, backend="triton", return_aux=True, **options)
    with torch.no_grad():
        ref, ref_aux = entmax_attention(q.double(), k.double(), v.double(), backend="reference",
                                        return_aux=True, **options)
        low = entmax_attention(q, k, v, backend="reference", **options)
    assert max_err(out, ref) <= 2 * max_err(low, ref) + FLOOR[case["dtype"]]
    empty = torch.isinf(ref_aux.tau)
    assert torch.equal(torch.isinf(aux.tau), empty)
    assert max_err(aux.tau[~empty], ref_aux.tau[~empty]) <= 1e-3
    assert (aux.support_size.long() - ref_aux.support_size.long()).abs().max().item() <= 1


def test_large_inputs_softmax_gradients_match_flash_peer():
    """Inputs x100, softmax, fp16: nearly one-hot rows, where dq and dk are differences dp - delta of two
    fp32 sums of size |dO| |V| that cancel. Kernels that take delta = rowsum(dO * O) (FlashAttention's
    convention, ours: dO . o2) keep an fp32 rounding residue there that the dense reference's autograd does
    not. Ours must be no worse than torch's own CPU flash kernel on the same inputs (both against fp64)."""
    case = C(1.0, True, 200, 200, 64, torch.float16, B=2)
    q, k, v, options, tensors = make_inputs(case, scale_inputs=100.0)
    d_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    ref = run_attention(q, k, v, options, tensors, d_out, "reference", torch.float64, "cpu")
    ours = run_attention(q, k, v, options, tensors, d_out, "triton")[3]
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
    flash = torch.autograd.grad(out, leaves, d_out.to(out.dtype))
    for name, g, peer, r in zip(("dq", "dk", "dv"), ours, flash, ref[3], strict=True):
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        assert max_err(g, r) <= 1.2 * max_err(peer, r) + FLOOR[torch.float16], (name, max_err(g, r),
                                                                                  max_err(peer, r))


@pytest.mark.parametrize("case", [C(1.5, True, 130, 130, 64, torch.float16, B=2, alibi="heads", q_scale=True,
                                    kpm=True),
                                  C(1.0, True, 300, 300, 64, torch.float16, B=2, kpm=True)], ids=case_id)
def test_large_inputs(case):
    """Inputs x100 (logits in the thousands, nearly one-hot rows): finite, and dq, dk, dq_scale within the
    residue of delta = dO . o2 that the same computation leaves in fp32 (flash_convention_grads)."""
    check_case(case, scale_inputs=100.0, flash_grads=True)


@pytest.mark.parametrize("case", [C(1.5, True, 130, 130, 48, alibi="heads", q_scale=True, kpm=True, B=2),
                                  C(1.25, False, 63, 111, 16, torch.float16, alibi="heads"),
                                  C(2.0, True, 17, 130, 16, torch.float16, q_scale=True)], ids=case_id)
def test_threshold_passes_started_from_row_max(case, monkeypatch):
    """attention_fwd.START_TOPK = 0: the passes start from m - 1 instead of the lower bound built from the
    largest per-tile row maxima (the default); results as with the default start. The multi-pass path, the
    one with that start, is forced (single_tile=False: rows of 128 keys or fewer take the single-tile one)."""
    from asentmax.ops.triton import attention as triton_attention
    from asentmax.ops.triton import attention_fwd

    monkeypatch.setattr(attention_fwd, "START_TOPK", 0)
    monkeypatch.setattr(triton_attention, "entmax_attention_fwd",
                        functools.partial(attention_fwd.entmax_attention_fwd, single_tile=False))
    check_case(case)


def test_kept_maxima_start_saves_threshold_passes(monkeypatch):
    """On Gaussian logits (640 keys) the start from 16 kept maxima needs fewer passes than m - 1."""
    from asentmax.ops.triton import attention_fwd

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 640, 16, generator=gen) for _ in range(3))
    mean_passes = []
    for topk in (0, 16):
        monkeypatch.setattr(attention_fwd, "START_TOPK", topk)
        *_, passes = attention_fwd.entmax_attention_fwd(
            q, k, v, mode=1, alpha=1.5, scale=0.25, causal=True, slopes=None, q_scale=None, kpm=None,
            write_o2=False, tol=3e-2, max_iter=40, blocks=(64, 64, 4, 3))
        mean_passes.append(passes.float().mean().item())
    assert mean_passes[1] < mean_passes[0] - 0.5, mean_passes


def test_backward_reads_strided_output_gradient():
    """The backward reads dO through its strides (a model's head transpose gives a dO that is not
    contiguous): the gradients equal those of the same values laid out contiguously, bit for bit, and both
    match the fp64 reference (check_case's bound) through check_case's own inputs."""
    case = C(1.5, True, 70, 70, 48, B=2, H=4, Hkv=2, alibi="heads", q_scale=True)
    q, k, v, options, tensors = make_inputs(case)
    gen = torch.Generator().manual_seed(3)
    d_out_bthd = torch.randn(q.shape[0], q.shape[2], q.shape[1], q.shape[3], generator=gen)
    strided = d_out_bthd.transpose(1, 2)  # (B, H, T, D) view, last dimension dense
    assert not strided.is_contiguous()
    *_, grads_strided = run_attention(q, k, v, options, tensors, strided, "triton")
    *_, grads_dense = run_attention(q, k, v, options, tensors, strided.contiguous(), "triton")
    for name, a, b in zip(("dq", "dk", "dv", "dq_scale"), grads_strided, grads_dense, strict=True):
        assert torch.equal(a, b), f"{name}: strided dO gives different gradients"
    *_, grads_ref = run_attention(q, k, v, options, tensors, strided, "reference", torch.float64)
    for name, a, r in zip(("dq", "dk", "dv", "dq_scale"), grads_strided, grads_ref, strict=True):
        assert max_err(a, r) <= 1e-4 * max(1.0, r.abs().max().item()), f"{name} differs from fp64"


@pytest.mark.parametrize("blocks", [((32, 16, 4, 2), (64, 32, 4, 2), (16, 64, 4, 2)),
                                    ((64, 64, 4, 3), (16, 16, 4, 2), (128, 16, 4, 2)),
                                    ((16, 32, 4, 2), (64, 64, 4, 2), (64, 64, 8, 2))],
                         ids=["coarser-backward", "finer-and-mixed", "one-backward-tile"])
def test_backward_tile_shapes_differ_from_forward(blocks, monkeypatch):
    """Each kernel with its own tile shape (attention_common.KERNEL_BLOCKS: forward, dq, dk/dv): the backward
    kernels read the forward's tile table resampled to their tiles, coarser and finer along each axis, from a
    NaN-poisoned table whose entries past the diagonal stay unwritten. The ALiBi head with slope 1 leaves
    most tiles off the diagonal dead, so a resampled maximum that is too low (or an unwritten entry read as
    live or dead wrongly) drops live tiles and fails the fp64 check."""
    from asentmax.ops.triton import attention_common

    monkeypatch.setitem(attention_common.KERNEL_BLOCKS, 64, blocks)
    check_case(C(1.5, True, 150, 200, 16, B=2, alibi="heads", q_scale=True, kpm=True))
