"""entmax_attention's kv_lengths (the filled slots of a fixed-size cache buffer) against its definition: for
every batch row b, the same call on k, v and key_padding_mask sliced to their first kv_lengths[b] slots, by
the fp64 reference. The slots past a row's length are filled with NaN, so a backend that reads them (or
multiplies them by a zero weight) fails. Forward and gradients for reference and chunked; the decoding
kernels (both paths, forced) under TRITON_INTERPRET=1; the dispatcher sends a triton call that needs
gradients to chunked; bad lengths are refused in one line.
"""

import os

import pytest
import torch

from asentmax.ops.attention import entmax_attention
from conftest import nan_poisoned_empty

SLOPES = torch.tensor([0.3, 0.0, 0.1, 0.05], dtype=torch.float64)  # ALiBi on three heads, NoPE on one


def make_inputs(n_k, lengths, n_q, dtype, seed=0, heads=4, kv_heads=2, dim=8):
    gen = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    q = torch.randn(batch, heads, n_q, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, n_k, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, n_k, dim, generator=gen, dtype=torch.float64)
    mask = torch.rand(batch, n_k, generator=gen) > 0.3
    q_scale = 1.0 + torch.rand(batch, heads, n_q, generator=gen, dtype=torch.float64)
    lengths = torch.tensor(lengths)
    k_poisoned, v_poisoned = k.clone(), v.clone()
    for b, length in enumerate(lengths.tolist()):
        k_poisoned[b, :, length:] = float("nan")
        v_poisoned[b, :, length:] = float("nan")
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), k_poisoned=k_poisoned.to(dtype),
                v_poisoned=v_poisoned.to(dtype), mask=mask, q_scale=q_scale.to(dtype), lengths=lengths)


def sliced_reference(x, alpha, causal, with_mask, grad=False):
    """Per row b: the fp64 reference on the first lengths[b] slots; outputs (B, H, Nq, D) and, with grad,
    the gradients of sum(out * w) for a fixed w, with zeros at the slots past each length."""
    outs, grads = [], []
    w = weights(x["q"].shape)  # out has q's shape
    for b, length in enumerate(x["lengths"].tolist()):
        q = x["q"][b:b + 1].double().requires_grad_(grad)
        k = x["k"][b:b + 1, :, :length].double().requires_grad_(grad)
        v = x["v"][b:b + 1, :, :length].double().requires_grad_(grad)
        q_scale = x["q_scale"][b:b + 1].double().requires_grad_(grad)
        out, aux = entmax_attention(q, k, v, alpha=alpha, causal=causal, alibi_slopes=SLOPES, q_scale=q_scale,
                                    key_padding_mask=x["mask"][b:b + 1, :length] if with_mask else None,
                                    backend="reference", return_aux=True)
        outs.append((out, aux))
        if grad:
            (out * w[b:b + 1]).sum().backward()
            pad = x["k"].shape[2] - length
            grads.append((q.grad, torch.nn.functional.pad(k.grad, (0, 0, 0, pad)),
                          torch.nn.functional.pad(v.grad, (0, 0, 0, pad)), q_scale.grad))
    out = torch.cat([o for o, _ in outs])
    support = torch.cat([a.support_size for _, a in outs])
    grads = [torch.cat(g) for g in zip(*grads, strict=True)] if grad else None
    return out, support, grads


def weights(shape):
    return torch.linspace(-1.0, 1.0, int(torch.tensor(shape).prod()), dtype=torch.float64).reshape(shape)


CASES = [  # (n_k, lengths, n_q): full, shortest (= Nq) and middle lengths; one query and several
    (37, (37, 3, 20), 3),
    (19, (1, 19, 7), 1),
    (50, (50, 50), 5),  # equal lengths (the static cache's case), a longer query block
]


@pytest.mark.parametrize("backend", ["reference", "chunked"])
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 2.5])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_kv_lengths_equal_sliced_rows(backend, alpha, causal, case):
    n_k, lengths, n_q = case
    x = make_inputs(n_k, lengths, n_q, torch.float64)
    names = ("q", "k_poisoned", "v_poisoned", "q_scale")
    q, k, v, q_scale = (x[name].clone().requires_grad_() for name in names)
    out, aux = entmax_attention(q, k, v, alpha=alpha, causal=causal, alibi_slopes=SLOPES, q_scale=q_scale,
                                key_padding_mask=x["mask"], kv_lengths=x["lengths"], backend=backend,
                                return_aux=True)
    (out * weights(out.shape)).sum().backward()
    ref, support, ref_grads = sliced_reference(x, alpha, causal, with_mask=True, grad=True)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert torch.equal(aux.support_size, support)
    grads = (q.grad, k.grad, v.grad, q_scale.grad)
    for name, got, want in zip(("q", "k", "v", "q_scale"), grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="run with TRITON_INTERPRET=1")
@pytest.mark.parametrize("path, n_k",
                         [("short", 150), ("split", 150), ("split", 700), ("split-threshold", 700)])
@pytest.mark.parametrize("alpha, causal, with_mask",
                         [(1.5, True, True), (1.0, True, False), (2.0, False, True)])
def test_decoding_kernels_take_kv_lengths(monkeypatch, path, n_k, alpha, causal, with_mask):
    """The one-launch kernel and the split one (chunks of 128 keys: a row's length ends inside a chunk,
    whole chunks past it; the thresholds solved in the output kernel or, split-threshold, in their own
    launch) read only each row's filled slots, in fp32, with every buffer the launchers allocate NaN-filled
    (a score or partial read where none was written shows)."""
    pytest.importorskip("triton")
    from asentmax.ops.triton import attention_decode

    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: path == "short")
    monkeypatch.setattr(attention_decode, "SPLIT_CHUNK", 128)
    if path == "split-threshold":
        monkeypatch.setattr(attention_decode, "SOLVE_SCORES", 0)
    x = make_inputs(n_k, (n_k, 2, n_k // 2 + 3), 2, torch.float32)
    lengths = x["lengths"].to(torch.int32).repeat_interleave(2)[::2]  # a strided view: read as such
    assert not lengths.is_contiguous()
    with torch.no_grad(), nan_poisoned_empty():
        out, aux = entmax_attention(x["q"], x["k_poisoned"], x["v_poisoned"], alpha=alpha, causal=causal,
                                    alibi_slopes=SLOPES.float(), q_scale=x["q_scale"],
                                    key_padding_mask=x["mask"] if with_mask else None,
                                    kv_lengths=lengths, backend="triton", return_aux=True)
    ref, support, _ = sliced_reference(x, alpha, causal, with_mask)
    assert (out.double() - ref).abs().max().item() <= 2e-5
    assert torch.equal(aux.support_size, support)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="run with TRITON_INTERPRET=1")
def test_triton_call_with_gradients_goes_to_chunked():
    """The fused training kernels take no lengths: the dispatcher computes such a call by chunked."""
    pytest.importorskip("triton")
    x = make_inputs(40, (40, 25), 20, torch.float32)  # 20 queries: not a decoding call either
    q = x["q"].clone().requires_grad_()
    out = entmax_attention(q, x["k_poisoned"], x["v_poisoned"], alpha=1.5, alibi_slopes=SLOPES.float(),
                           q_scale=x["q_scale"], key_padding_mask=x["mask"], kv_lengths=x["lengths"],
                           backend="triton")
    out.sum().backward()
    ref, _, _ = sliced_reference(x, 1.5, True, with_mask=True)
    assert (out.double() - ref).abs().max().item() <= 1e-5
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("lengths, message", [
    (torch.tensor([5, 3.0]), "kv_lengths must have dtype"),
    (torch.tensor([5]), r"kv_lengths must have shape \(2,\)"),
    (torch.tensor([5, 1]), r"kv_lengths must lie in \[Nq, Nk\] = \[2, 6\] .* got values in \[1, 5\]"),
    (torch.tensor([7, 3]), r"got values in \[3, 7\]"),
])
def test_bad_kv_lengths_refused(lengths, message):
    q, k = torch.randn(2, 2, 2, 4), torch.randn(2, 2, 6, 4)
    with pytest.raises(ValueError, match=message):
        entmax_attention(q, k, k, kv_lengths=lengths, backend="chunked")
