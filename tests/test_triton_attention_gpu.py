"""Triton entmax attention on the GPU (marker `gpu`): the interpreter matrix at real sizes, more head dims and
dtypes, N = 4K-16K spot checks, inputs scaled x100, all-masked rows, and no recompilation per length.

Same checker as test_triton_attention.py (kernel error vs fp64 <= C x same-dtype reference error + floor).
"""

import pytest
import torch

from test_triton_attention import C, case_id, check_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("triton")

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

GPU_CASES = [
    C(1.5, True, 1, 1, 64, BF16),
    C(1.5, True, 1000, 1000, 64, BF16, B=2, H=4, Hkv=2, alibi="heads", q_scale=True),
    C(1.5, False, 777, 777, 48, FP16, alibi="heads", q_scale=True, kpm=True, B=2),
    C(1.5, True, 513, 2049, 80, FP32, H=4, Hkv=1, alibi="batch", q_scale=True),
    C(2.0, True, 1023, 1023, 96, BF16, B=2, kpm=True),
    C(2.0, False, 300, 300, 128, FP32, alibi="heads"),
    C(1.25, True, 700, 700, 256, BF16, q_scale=True),
    C(1.75, False, 257, 1000, 16, FP16, alibi="heads", kpm=True, B=2),
    C(1.0, True, 1000, 1000, 64, BF16, H=4, Hkv=2, alibi="heads", q_scale=True, kpm=True, B=2),
    C(1.0, False, 333, 999, 128, FP32, q_scale=True),
    C(1.5, True, 1, 4096, 64, BF16, B=2, H=4, Hkv=1, kpm=True, q_scale=True),  # decoding against a cache
    C(1.5, True, 4096, 4096, 64, BF16, H=2, alibi="heads", q_scale=True),
    C(1.5, True, 4096, 4096, 128, FP16, H=2, Hkv=1),
    # the forward's single-tile path (<= 128 keys, head_dim <= 64) in bf16: the training shape with NAPE heads
    C(1.5, True, 90, 90, 32, BF16, B=4, H=16, Hkv=16, alibi="heads", q_scale=True),
    C(1.0, True, 73, 73, 32, BF16, B=4, H=16, Hkv=16, alibi="heads"),
    C(1.25, False, 33, 128, 64, BF16, B=2, H=4, Hkv=2, q_scale=True, kpm=True),
]


@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_triton_matches_reference_gpu(case):
    check_case(case, device="cuda")


@pytest.mark.parametrize("case", [C(1.5, True, 1000, 1000, 64, BF16, alibi="heads", q_scale=True, kpm=True,
                                    B=2),
                                  C(1.0, True, 600, 600, 64, FP16, kpm=True, B=2),
                                  C(2.0, False, 600, 600, 128, BF16)], ids=case_id)
def test_large_inputs_gpu(case):
    """Inputs x100: logits in the thousands, nearly one-hot weights; nothing may overflow to NaN/Inf, and the
    gradients that subtract delta stay within the fp32 residue of the flash convention (check_case)."""
    check_case(case, device="cuda", scale_inputs=100.0, flash_grads=True)


def dense_entmax_attention(q, k, v, alpha, dtype):
    """Causal alpha-entmax attention computed densely in `dtype` on the GPU by bisection on tau (an oracle
    independent of the kernels, for lengths where the CPU reference is too slow). Returns (out, tau)."""
    n = q.shape[2]
    z = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * q.shape[-1] ** -0.5
    z = z.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    s = (alpha - 1) * z
    hi = s.amax(-1, keepdim=True)
    lo = hi - 1
    for _ in range(60 if dtype == torch.float64 else 30):
        mid = (lo + hi) / 2
        big = (s - mid).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) >= 1
        lo, hi = torch.where(big, mid, lo), torch.where(big, hi, mid)
    p = (s - lo).clamp_min(0).pow(1 / (alpha - 1))
    return (p / p.sum(-1, keepdim=True)) @ v.to(dtype), lo[..., 0]


@pytest.mark.parametrize("n", [8192, 16384])
def test_long_sequence_forward_gpu(n):
    """N = 8K, 16K spot checks of the forward and tau (bf16 inputs) against a dense fp64 oracle."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 64, device="cuda", dtype=BF16, generator=gen) for _ in range(3))
    from asentmax.ops.attention import entmax_attention

    out, aux = entmax_attention(q, k, v, alpha=1.5, backend="triton", return_aux=True)
    ref, ref_tau = dense_entmax_attention(q, k, v, 1.5, torch.float64)
    low = dense_entmax_attention(q, k, v, 1.5, torch.float32)[0].to(BF16)
    err, low_err = (out.double() - ref).abs().max().item(), (low.double() - ref).abs().max().item()
    assert err <= 2 * low_err + 1e-2 * ref.abs().max().item(), (err, low_err)
    assert (aux.tau.double() - ref_tau).abs().max().item() <= 1e-3


def test_no_recompilation_per_length_gpu():
    from asentmax.ops.attention import entmax_attention
    from asentmax.ops.triton.attention_bwd import _entmax_attention_bwd_dkdv, _entmax_attention_bwd_dq
    from asentmax.ops.triton.attention_fwd import _entmax_attention_fwd

    kernels = (_entmax_attention_fwd, _entmax_attention_bwd_dkdv, _entmax_attention_bwd_dq)

    def n_compiled():
        return sum(len(cache[0]) for fn in kernels for cache in fn.device_caches.values())

    # long rows (the forward's multi-pass path), then rows of 65-128 keys (its single-tile path, one width)
    for lengths in ((1000, 1001, 1017, 2222, 3000), (65, 73, 90, 127, 128)):
        counts = []
        for n in lengths:
            q, k, v = (torch.randn(1, 2, n, 64, device="cuda", dtype=BF16, requires_grad=True)
                       for _ in range(3))
            entmax_attention(q, k, v, alpha=1.5, backend="triton").sum().backward()
            counts.append(n_compiled())
        assert counts[1:] == counts[:-1], f"kernels compiled per length {lengths}: {counts}"
