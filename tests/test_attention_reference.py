"""Tier 1 for asentmax.ops.attention: the dense reference vs an independent per-row fp64 loop
(docs/method.md section 3 logits, entmax by bisection to full fp64 precision), and argument validation."""

import math

import pytest
import torch

from asentmax.ops.attention import AttentionAux, entmax_attention


def entmax_row_fp64(z, alpha):
    """alpha-entmax of a 1-D fp64 row (finite entries) by bisection on tau; softmax for alpha == 1."""
    if alpha == 1.0:
        p = torch.exp(z - z.max())
        return p / p.sum(), float(torch.logsumexp(z, 0))
    s = (alpha - 1) * z
    lo, hi = float(s.max()) - 1.0, float(s.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        mass = (torch.clamp(s - mid, min=0) ** (1 / (alpha - 1))).sum()
        lo, hi = (mid, hi) if mass >= 1 else (lo, mid)
    p = torch.clamp(s - lo, min=0) ** (1 / (alpha - 1))
    return p, lo


def naive_attention(q, k, v, alpha, causal, scale, slopes, q_scale, mask):
    """Loop over (b, h, r); build the visible keys' logits one row at a time, in fp64."""
    batch, heads, n_q, dim = q.shape
    n_k = k.shape[2]
    group = heads // k.shape[1]
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros(batch, heads, n_q, dim, dtype=torch.float64)
    tau = torch.full((batch, heads, n_q), math.inf, dtype=torch.float64)
    support = torch.zeros(batch, heads, n_q, dtype=torch.int64)
    for b in range(batch):
        for h in range(heads):
            slope = 0.0 if slopes is None else float(slopes[h] if slopes.dim() == 1 else slopes[b, h])
            for r in range(n_q):
                pos = r + n_k - n_q
                keys = [j for j in range(n_k)
                        if (not causal or j <= pos) and (mask is None or bool(mask[b, j]))]
                if not keys:
                    continue
                theta = 1.0 if q_scale is None else float(q_scale[b, h, r])
                z = torch.stack([theta * scale * (q[b, h, r] @ k[b, h // group, j]) - slope * abs(pos - j)
                                 for j in keys])
                p, tau[b, h, r] = entmax_row_fp64(z, alpha)
                support[b, h, r] = len(keys) if alpha == 1.0 else int((p > 0).sum())  # softmax: all visible
                out[b, h, r] = p @ v[b, h // group, keys]
    return out, tau, support


CASES = [
    # (B, H, Hkv, Nq, Nk, D, causal, alibi, q_scale, padding)
    pytest.param(1, 2, 2, 7, 7, 16, True, False, False, False, id="plain-causal"),
    pytest.param(2, 4, 2, 5, 9, 8, True, True, True, True, id="gqa-cache-alibi-qscale-pad"),
    pytest.param(1, 3, 1, 6, 6, 4, False, True, False, True, id="mqa-noncausal-alibi-pad"),
    pytest.param(2, 2, 1, 1, 11, 16, True, False, True, False, id="decode-1-query"),
]


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.3], ids=lambda a: f"alpha{a}")
@pytest.mark.parametrize("batch,heads,kv_heads,n_q,n_k,dim,causal,alibi,qs,padding", CASES)
def test_reference_matches_naive_fp64(alpha, batch, heads, kv_heads, n_q, n_k, dim, causal, alibi, qs,
                                      padding):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, n_q, dim, generator=gen, dtype=torch.float64) * 2
    k = torch.randn(batch, kv_heads, n_k, dim, generator=gen, dtype=torch.float64) * 2
    v = torch.randn(batch, kv_heads, n_k, dim, generator=gen, dtype=torch.float64)
    slopes = None
    if alibi:
        slopes = torch.rand(heads, generator=gen, dtype=torch.float64)
        slopes[0] = 0.0  # a NoPE head
    q_scale = torch.rand(batch, heads, n_q, generator=gen, dtype=torch.float64) * 2 + 0.5 if qs else None
    mask = None
    if padding:
        mask = torch.rand(batch, n_k, generator=gen) > 0.3
        mask[0, :] = False  # batch row 0: every key is padding -> all-zero output, tau = inf
    out, aux = entmax_attention(q, k, v, alpha=alpha, causal=causal, alibi_slopes=slopes, q_scale=q_scale,
                                key_padding_mask=mask, backend="reference", return_aux=True)
    want_out, want_tau, want_support = naive_attention(q, k, v, alpha, causal, 1 / math.sqrt(dim), slopes,
                                                       q_scale, mask)
    assert isinstance(aux, AttentionAux)
    assert out.dtype == torch.float64 and aux.tau.dtype == torch.float32
    assert aux.support_size.dtype == torch.int32
    torch.testing.assert_close(out, want_out, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(aux.tau.double(), want_tau, rtol=1e-5, atol=1e-5)
    assert torch.equal(aux.support_size.long(), want_support)
    if padding:
        assert torch.all(out[0] == 0) and torch.all(aux.tau[0] == math.inf)


def _qkv(heads=4, kv_heads=2, n_q=5, n_k=7, dim=8, dtype=torch.float32):
    return (torch.randn(2, heads, n_q, dim, dtype=dtype), torch.randn(2, kv_heads, n_k, dim, dtype=dtype),
            torch.randn(2, kv_heads, n_k, dim, dtype=dtype))


BAD_INPUTS = [
    pytest.param(lambda q, k, v: dict(q=q[0]), "4-D", id="q-3d"),
    pytest.param(lambda q, k, v: dict(q=q.long()), "floating", id="q-int"),
    pytest.param(lambda q, k, v: dict(k=k.double(), v=v.double()), "dtype", id="dtype-mismatch"),
    pytest.param(lambda q, k, v: dict(v=v.half()), "one dtype", id="v-dtype-mismatch"),
    pytest.param(lambda q, k, v: dict(v=v.long()), "v must be a floating", id="v-int"),
    pytest.param(lambda q, k, v: dict(k=k[0], v=v[0]), "k must be 4-D", id="k-3d"),
    pytest.param(lambda q, k, v: dict(k=k.to("meta"), v=v.to("meta")), "one device", id="kv-device-mismatch"),
    pytest.param(lambda q, k, v: dict(q_scale=torch.ones(2, 4, 5, device="meta")), "q_scale is on meta",
                 id="qscale-device-mismatch"),
    pytest.param(lambda q, k, v: dict(v=v[:, :, :-1]), "same shape", id="kv-shape-mismatch"),
    pytest.param(lambda q, k, v: dict(k=k[:1], v=v[:1]), "batch", id="batch-mismatch"),
    pytest.param(lambda q, k, v: dict(k=k[..., :4], v=v[..., :4]), "head_dim", id="dim-mismatch"),
    pytest.param(lambda q, k, v: dict(q=q[:, :3]), "multiple", id="gqa-not-divisible"),
    pytest.param(lambda q, k, v: dict(q=torch.randn(2, 4, 8, 8)), "exceed", id="nq-gt-nk"),
    pytest.param(lambda q, k, v: dict(alpha=0.5), "alpha", id="alpha-lt-1"),
    pytest.param(lambda q, k, v: dict(alpha=float("nan")), "alpha", id="alpha-nan"),
    pytest.param(lambda q, k, v: dict(alpha=10.5), "alpha must lie in", id="alpha-above-entmax-range"),
    pytest.param(lambda q, k, v: dict(scale=float("inf")), "scale", id="scale-inf"),
    pytest.param(lambda q, k, v: dict(alibi_slopes=torch.ones(3)), "alibi_slopes", id="slopes-shape"),
    pytest.param(lambda q, k, v: dict(alibi_slopes=torch.ones(4, dtype=torch.long)), "alibi_slopes",
                 id="slopes-int"),
    pytest.param(lambda q, k, v: dict(q_scale=torch.ones(2, 4, 7)), "q_scale", id="qscale-shape"),
    pytest.param(lambda q, k, v: dict(key_padding_mask=torch.ones(2, 7)), "key_padding_mask",
                 id="mask-not-bool"),
    pytest.param(lambda q, k, v: dict(key_padding_mask=torch.ones(2, 5, dtype=torch.bool)),
                 "key_padding_mask", id="mask-shape"),
    pytest.param(lambda q, k, v: dict(backend="flash"), "backend", id="unknown-backend"),
]


@pytest.mark.parametrize("change,message", BAD_INPUTS)
def test_bad_inputs_raise_value_error(change, message):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v)
    args.update(change(q, k, v))
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=message):
        entmax_attention(q, k, v, **args)


def test_non_tensor_and_non_number_raise_type_error():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q"):
        entmax_attention(q.tolist(), k, v)
    with pytest.raises(TypeError, match="v must be a torch.Tensor"):
        entmax_attention(q, k, v.tolist())
    with pytest.raises(TypeError, match="scale"):
        entmax_attention(q, k, v, scale="0.5")
    with pytest.raises(TypeError, match="alpha"):
        entmax_attention(q, k, v, alpha="1.5")


def test_auto_backend_on_cpu_matches_reference():
    torch.manual_seed(1)
    q, k, v = _qkv(dtype=torch.float64)
    got = entmax_attention(q, k, v, alpha=1.5)
    want = entmax_attention(q, k, v, alpha=1.5, backend="reference")
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)
