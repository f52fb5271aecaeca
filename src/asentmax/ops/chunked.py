"""Memory-efficient entmax attention in pure torch: never materialises an Nq x Nk tensor.

Layout (batch, heads, seq, head_dim). Same semantics as attention.py / reference.py (arXiv:2506.16640,
section 2:
z = q_scale * scale * (q . k) - slope * |pos(r) - j|, p = alpha-entmax(z), out = p v).

Queries are processed in blocks of `block_q` rows. For one block the logits against the visible keys
(B, H, block_q, Nk') are built, the row thresholds tau found with asentmax.ops.entmax, and p v
accumulated; causal blocks stop at their last visible key, so peak memory is O(B * H * block_q * Nk).
Grouped-query heads are folded into the row dimension (B * Hkv, G * block_q, D), so k and v are never
repeated. Only tau (B, H, Nq) and the output are kept for the backward pass, which recomputes p per block
from tau and applies the entmax Jacobian (arXiv:2506.16640, section 2; u = p^(2 - alpha) on the support):
    dz = u * (dp - sum(u dp) / sum(u)),  dp = dO v^T        (softmax: dz = p * (dp - sum(dO * O)))
then dq, dk, dv and d q_scale through z = (scale * q_scale * q) . k + bias. For alpha > 2, u grows as
p shrinks and the recomputation from tau loses exactly the small p that dominate it, so there p and dz
come from the entmax solve of the block and its own (cancellation-free) backward instead.

Forward and backward are the torch custom ops asentmax::chunked_attention and
asentmax::chunked_attention_bwd: torch.compile keeps their block loops (python control flow on the
shapes, and on whether any row is empty) out of the graph as one opaque call each, so that a compiled
model neither breaks its graph nor recompiles per sequence length here.
"""

import torch
from torch import Tensor

from asentmax.ops.entmax import compute_dtype, entmax, entmax_vjp
from asentmax.ops.reference import query_positions
from asentmax.ops.types import AttentionAux, BackendSupport

SUPPORT = BackendSupport()  # every alpha >= 1, head_dim and float dtype

BLOCK_ELEMENTS = 1 << 24  # logits per block buffer (64 MiB in fp32); a block holds a few such buffers


def default_block_q(batch, heads, n_q, n_k):
    """Largest query block whose (B, H, block, Nk) logits fit in BLOCK_ELEMENTS, at least 16 rows.

    Large blocks matter: every block re-reads k and v (and updates dk, dv) over all its keys, O(Nk * D),
    against O(block * Nk) logits work (measured, H=4: backward ~2x faster at 16K tokens with 256-row blocks
    than with 64-row blocks)."""
    return max(16, min(n_q, BLOCK_ELEMENTS // (batch * heads * n_k)))


class _Problem:
    """Shapes, masks and ALiBi slopes shared by the forward and backward block loops."""

    def __init__(self, q, k, alpha, causal, alibi_slopes, key_padding_mask, kv_lengths, block_q):
        self.batch, self.heads, self.n_q, self.dim = q.shape
        self.kv_heads, self.n_k = k.shape[1], k.shape[2]
        self.group = self.heads // self.kv_heads
        self.alpha, self.causal, self.block_q = alpha, causal, block_q
        self.dtype, self.device = compute_dtype(q.dtype), q.device
        self.padding = None if key_padding_mask is None else ~key_padding_mask[:, None, None, None, :]
        self.neg_slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes.to(self.dtype)
            slopes = slopes[None] if slopes.dim() == 1 else slopes
            self.neg_slopes = -slopes.reshape(slopes.shape[0], self.kv_heads, self.group, 1, 1)
        self.keys = torch.arange(self.n_k, device=self.device)
        self.pos = query_positions(self.n_q, self.n_k, kv_lengths, self.device)  # (B or 1, Nq)
        # the rows' last visible position (B or 1, Nq), and the keys [0, filled) a row can hold
        filled = torch.full((1, 1), self.n_k, device=self.device) if kv_lengths is None else (
            kv_lengths.long().clamp(max=self.n_k)[:, None])
        last = self.pos if causal else (filled - 1).expand(-1, self.n_q)
        if key_padding_mask is None:
            counts = last + 1
        else:
            last = last.expand(self.batch, -1)
            counts = key_padding_mask.cumsum(-1).gather(1, last.clamp(min=0)).masked_fill(last < 0, 0)
        self.empty = (counts <= 0)[:, None, None, :, None]  # (B or 1, 1, 1, Nq, 1): no visible key
        self.length_mask = None  # without causality, the keys past a row's kv_lengths
        if kv_lengths is not None and not causal:
            self.length_mask = (self.keys >= filled)[:, None, None, None, :]
        any_empty, key_end, key_start = torch.stack([self.empty.any().long(), filled.max(), filled.min()]
                                                    ).tolist()  # one host read
        self.any_empty, self.key_end = bool(any_empty), key_end
        # rows of unequal kv_lengths: the slots past a row's length (which may hold anything, NaN included)
        # are read for the longer rows, and 0 * NaN would reach the sums: flat_kv zeroes them
        self.past_length = None
        if key_start < key_end:
            past = (self.keys >= filled)[:, None, :, None].expand(-1, self.kv_heads, -1, -1)
            self.past_length = past.reshape(self.batch * self.kv_heads, self.n_k, 1)
        # the first key that can lie in the future of row r is pos(r) + 1 >= r + first_future
        self.first_future = (self.n_k - self.n_q if kv_lengths is None else -self.n_q) + 1

    def blocks(self):
        """(r0, r1, kend): query rows [r0, r1) and the keys [0, kend) any of them can see."""
        for r0 in range(0, self.n_q, self.block_q):
            r1 = min(r0 + self.block_q, self.n_q)
            yield r0, r1, min(self.key_end, r1 + self.key_end - self.n_q) if self.causal else self.key_end

    def rows(self, x, r0, r1):
        """(B, H, Nq, E) -> rows [r0, r1) of every head as (B * Hkv, G * n, E)."""
        x = x.reshape(self.batch, self.kv_heads, self.group, self.n_q, x.shape[-1])[:, :, :, r0:r1]
        return x.reshape(self.batch * self.kv_heads, self.group * (r1 - r0), x.shape[-1])

    def flat_kv(self, x):
        """(B, Hkv, Nk, D) -> (B * Hkv, Nk, D): a view where the heads can be merged (a contiguous tensor, or
        the filled slots of a KV cache's buffer), else a copy; a copy with zeros past each row's kv_lengths
        when they differ."""
        x = x.reshape(self.batch * self.kv_heads, self.n_k, x.shape[-1])
        return x if self.past_length is None else x.masked_fill(self.past_length, 0.0)

    def logits(self, qhat_rows, k, r0, r1, kend):
        """z (B, Hkv, G, n, kend) for rows [r0, r1); -inf on hidden keys, 0 on rows with no visible key."""
        z = torch.bmm(qhat_rows, k[:, :kend].transpose(-1, -2))
        z = z.view(self.batch, self.kv_heads, self.group, r1 - r0, kend)
        pos = self.pos[:, None, None, r0:r1, None]  # (B or 1, 1, 1, n, 1)
        keys = self.keys[:kend]
        if self.neg_slopes is not None:
            z.addcmul_(self.neg_slopes, (pos - keys).abs().to(self.dtype))
        if self.causal:  # only keys after the block's first position can be in the future of a row
            first = max(0, r0 + self.first_future)
            z[..., first:].masked_fill_(keys[first:] > pos, float("-inf"))
        if self.length_mask is not None:
            z.masked_fill_(self.length_mask[..., :kend], float("-inf"))
        if self.padding is not None:
            z.masked_fill_(self.padding[..., :kend], float("-inf"))
        if self.any_empty:
            z.masked_fill_(self.empty[:, :, :, r0:r1], 0.0)
        return z

    def probs(self, z, r0, r1):
        """Forward: p and tau (B, Hkv, G, n, 1) from logits z (overwritten)."""
        z_max = z.amax(-1, keepdim=True)
        if self.alpha == 1.0:
            p = z.sub_(z_max).exp_()
            total = p.sum(-1, keepdim=True)
            p.div_(total)
            tau = z_max + total.log()
        else:
            p = entmax(z, alpha=self.alpha, dim=-1, backend="reference")
            # p increases with z: at the largest logit p_max^(alpha-1) = (alpha-1) z_max - tau.
            tau = (self.alpha - 1) * z_max - p.amax(-1, keepdim=True) ** (self.alpha - 1)
        if self.any_empty:
            empty = self.empty[:, :, :, r0:r1]
            p.masked_fill_(empty, 0.0)
            tau.masked_fill_(empty, float("inf"))
        return p, tau

    def probs_from_tau(self, z, tau):
        """Backward: recompute p = [(alpha-1) z - tau]_+^(1/(alpha-1)) (exp(z - tau) for softmax) in place."""
        if self.alpha == 1.0:
            return z.sub_(tau).exp_()
        return z.mul_(self.alpha - 1).sub_(tau).clamp_(min=0).pow_(1 / (self.alpha - 1))


@torch.library.custom_op("asentmax::chunked_attention", mutates_args=())
def chunked_attention(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor | None, alibi_slopes: Tensor | None,
                      key_padding_mask: Tensor | None, kv_lengths: Tensor | None, alpha: float, causal: bool,
                      scale: float, block_q: int, with_support: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(out, tau, support), out (B, H, Nq, D) and tau (B, H, Nq) in the compute dtype (fp32, fp64 for fp64
    inputs), support (B, H, Nq) int32 or empty. q contiguous, k and v in any layout (the filled slots of
    a KV cache's buffers are not copied); block_q 0 = default_block_q."""
    batch, heads, n_q, dim = q.shape
    if block_q == 0:
        block_q = default_block_q(batch, heads, n_q, k.shape[2])
    prob = _Problem(q, k, alpha, causal, alibi_slopes, key_padding_mask, kv_lengths, block_q)
    z_mult = scale if q_scale is None else scale * q_scale.to(prob.dtype)[..., None]
    qhat = q.to(prob.dtype) * z_mult  # (B, H, Nq, D)
    kc, vc = prob.flat_kv(k.to(prob.dtype)), prob.flat_kv(v.to(prob.dtype))  # (B * Hkv, Nk, D)
    shape5 = (prob.batch, prob.kv_heads, prob.group, prob.n_q)
    out = torch.empty(*shape5, prob.dim, dtype=prob.dtype, device=q.device)
    tau = torch.empty(*shape5, 1, dtype=prob.dtype, device=q.device)
    support = torch.empty(*shape5 if with_support else (0,), dtype=torch.int32, device=q.device)
    for r0, r1, kend in prob.blocks():
        z = prob.logits(prob.rows(qhat, r0, r1), kc, r0, r1, kend)
        if with_support and alpha == 1.0:  # softmax: every visible key (probs overwrites z)
            support[:, :, :, r0:r1] = ((z > float("-inf")) & ~prob.empty[:, :, :, r0:r1]).sum(-1)
        p, tau[:, :, :, r0:r1] = prob.probs(z, r0, r1)
        if with_support and alpha != 1.0:
            support[:, :, :, r0:r1] = (p > 0).sum(-1)
        p_rows = p.view(prob.batch * prob.kv_heads, -1, kend)
        out[:, :, :, r0:r1] = torch.bmm(p_rows, vc[:, :kend]).view(*shape5[:3], r1 - r0, prob.dim)
    rows = (batch, heads, n_q)
    return out.view(*rows, dim), tau.view(rows), support.view(rows) if with_support else support


@chunked_attention.register_fake
def _(q, k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths, alpha, causal, scale, block_q,
      with_support):
    dtype = compute_dtype(q.dtype)
    rows = q.shape[:3]
    return (q.new_empty(q.shape, dtype=dtype), q.new_empty(rows, dtype=dtype),
            q.new_empty(rows if with_support else (0,), dtype=torch.int32))


@torch.library.custom_op("asentmax::chunked_attention_bwd", mutates_args=())
def chunked_attention_bwd(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor | None,
                          alibi_slopes: Tensor | None, key_padding_mask: Tensor | None,
                          kv_lengths: Tensor | None, out: Tensor, tau: Tensor, alpha: float, causal: bool,
                          scale: float, block_q: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, d q_scale) of chunked_attention (d q_scale empty without q_scale); d_out is the
    gradient of its out (compute dtype)."""
    batch, heads, n_q, _ = q.shape
    if block_q == 0:
        block_q = default_block_q(batch, heads, n_q, k.shape[2])
    prob = _Problem(q, k, alpha, causal, alibi_slopes, key_padding_mask, kv_lengths, block_q)
    shape5 = (prob.batch, prob.kv_heads, prob.group, prob.n_q)
    out, tau = out.reshape(*shape5, prob.dim), tau.reshape(*shape5, 1)
    z_mult = scale if q_scale is None else scale * q_scale.to(prob.dtype)[..., None]
    qc = q.to(prob.dtype)
    qhat = qc * z_mult
    kc, vc = prob.flat_kv(k.to(prob.dtype)), prob.flat_kv(v.to(prob.dtype))
    d_out = d_out.to(prob.dtype).contiguous()
    delta = (d_out.view(out.shape) * out).sum(-1, keepdim=True)  # softmax: sum_j p dp = dO . O
    d_qhat = torch.empty_like(out)  # (B, Hkv, G, Nq, D)
    dk, dv = torch.zeros_like(kc), torch.zeros_like(vc)  # (B * Hkv, Nk, D)
    for r0, r1, kend in prob.blocks():
        qhat_rows, d_out_rows = prob.rows(qhat, r0, r1), prob.rows(d_out, r0, r1)  # (B * Hkv, G * n, D)
        z = prob.logits(qhat_rows, kc, r0, r1, kend)
        if alpha > 2.0:
            p = entmax(z, alpha=alpha, dim=-1, backend="reference")
            if prob.any_empty:
                p.masked_fill_(prob.empty[:, :, :, r0:r1], 0.0)
        else:
            p = prob.probs_from_tau(z, tau[:, :, :, r0:r1])
        dv[:, :kend].baddbmm_(p.view(-1, qhat_rows.shape[1], kend).transpose(-1, -2), d_out_rows)
        dp = torch.bmm(d_out_rows, vc[:, :kend].transpose(-1, -2)).view(p.shape)
        if alpha == 1.0:
            dz = dp.sub_(delta[:, :, :, r0:r1]).mul_(p)
        elif alpha > 2.0:
            dz = entmax_vjp(p.view(-1, kend), dp.view(-1, kend), alpha, False)[0].view(p.shape)
        else:
            u = p.pow_(2 - alpha) if alpha < 2 else torch.where(p > 0, p.pow(2 - alpha), 0.0)
            u_total = u.sum(-1, keepdim=True).clamp_(min=torch.finfo(prob.dtype).tiny)
            dz = dp.mul_(u)
            dz.sub_(u.mul_(dz.sum(-1, keepdim=True) / u_total))
        dz_rows = dz.view(-1, qhat_rows.shape[1], kend)
        d_qhat[:, :, :, r0:r1] = torch.bmm(dz_rows, kc[:, :kend]).view(*out.shape[:3], r1 - r0, prob.dim)
        dk[:, :kend].baddbmm_(dz_rows.transpose(-1, -2), qhat_rows)
    d_qhat = d_qhat.reshape(q.shape)
    dq = (d_qhat * z_mult).to(q.dtype)
    d_q_scale = q.new_empty(0)
    if q_scale is not None:
        d_q_scale = (scale * (d_qhat * qc).sum(-1)).to(q_scale.dtype)
    return dq, dk.view(k.shape).to(k.dtype), dv.view(v.shape).to(v.dtype), d_q_scale


@chunked_attention_bwd.register_fake
def _(d_out, q, k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths, out, tau, alpha, causal, scale,
      block_q):
    d_q_scale = q.new_empty(q.shape[:3], dtype=q_scale.dtype) if q_scale is not None else q.new_empty(0)
    return torch.empty_like(q), k.new_empty(k.shape), v.new_empty(v.shape), d_q_scale  # dk, dv contiguous


def _setup_context(ctx, inputs, output):
    q, k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths, alpha, causal, scale, block_q, _ = inputs
    out, tau, _ = output
    ctx.save_for_backward(q, k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths, out, tau)
    ctx.options = (alpha, causal, scale, block_q)


def _backward(ctx, d_out, _d_tau, _d_support):
    q, k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths, out, tau = ctx.saved_tensors
    dq, dk, dv, d_q_scale = chunked_attention_bwd(d_out, q, k, v, q_scale, alibi_slopes, key_padding_mask,
                                                  kv_lengths, out, tau, *ctx.options)
    return dq, dk, dv, (d_q_scale if q_scale is not None else None), *[None] * 8


chunked_attention.register_autograd(_backward, setup_context=_setup_context)


def chunked_entmax_attention(q, k, v, *, alpha, causal, scale, alibi_slopes, q_scale, key_padding_mask,
                             return_aux, kv_lengths=None, block_q=None):
    """Arguments as `entmax_attention`, already validated, with `scale` a float. Differentiable.

    block_q: query rows per block (default: `default_block_q`, a fixed logits budget per block).
    """
    out, tau, support = chunked_attention(
        q.contiguous(), k, v, q_scale, alibi_slopes, key_padding_mask, kv_lengths,
        alpha, causal, scale, 0 if block_q is None else block_q, return_aux)
    out = out.to(q.dtype)
    return (out, AttentionAux(tau.detach().float(), support)) if return_aux else out
