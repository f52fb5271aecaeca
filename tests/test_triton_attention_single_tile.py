"""The single-tile path of the fused forward (attention_fwd.py: all keys of a row in one register tile) vs the
fp64 reference, forward and gradients, at short awkward lengths up to its bound of 128 keys and one past it.

Runs under TRITON_INTERPRET=1 like test_triton_attention.py, whose checker it reuses (kernel error vs fp64
<= C x the same-dtype reference's error + floor, NaN-poisoned buffers). Each case also records which
forward variant was launched, so that a short input silently falling back to the multi-pass path fails. The
backward consumes the tile table, tau, 1/Z and o2 of this path: the gradient checks and the direct fp64
checks of the tile table and o2 below pin their meaning to the multi-pass path's.
"""

import functools
import os

import pytest
import torch

from asentmax.ops.attention import entmax_attention
from asentmax.ops.entmax import _gate, entmax
from asentmax.ops.reference import reference_logits
from asentmax.ops.triton.attention_common import forward_blocks, logit_constants, mode_of
from test_triton_attention import C, case_id, check_case, make_inputs, max_err, poisoned_allocations

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter tests: run with TRITON_INTERPRET=1 (GPU: *_gpu.py)")
F16 = torch.float16


def expected_keys(n_k, head_dim):
    """The register tile width the forward must launch with: 64 or 128 keys at head_dim <= 64 (BLOCK_N 64),
    0 (multi-pass) beyond 128 keys or head_dim 64."""
    if n_k > 128 or head_dim > 64:
        return 0
    return 64 if n_k <= 64 else 128


class recorded_forward_variants:
    """Within the block, the KEYS constexpr of every fused forward launch is appended to `self.keys`; the
    kernel runs unless run=False."""

    def __init__(self, run=True):
        self.run = run

    def __enter__(self):
        from asentmax.ops.triton import attention_fwd

        self.module, self.kernel, self.keys = attention_fwd, attention_fwd._entmax_attention_fwd, []
        outer = self

        class Recorder:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    outer.keys.append(kwargs["KEYS"])
                    if outer.run:
                        outer.kernel[grid](*args, **kwargs)
                return launch

        attention_fwd._entmax_attention_fwd = Recorder()
        return self

    def __exit__(self, *exc):
        self.module._entmax_attention_fwd = self.kernel


SHORT_CASES = [
    C(1.5, True, 1, 1, 32),
    C(2.0, True, 7, 7, 40, H=4, Hkv=2, alibi="heads", q_scale=True),  # GQA, head_dim not a power of two
    C(1.25, False, 63, 63, 32, B=2, kpm=True),
    C(1.0, True, 64, 64, 40, B=2, alibi="heads", q_scale=True, kpm=True),
    C(1.5, True, 65, 65, 32, F16, alibi="heads", q_scale=True),  # the o2 split (16-bit inputs, q_scale)
    C(1.5, True, 90, 90, 32, F16, H=4, alibi="heads", q_scale=True),  # the training shape: NAPE heads
    C(2.0, True, 20, 127, 40, B=2, q_scale=True, kpm=True),  # queries at the end of the keys
    C(1.25, True, 40, 73, 32, alibi="heads"),  # two BLOCK_N sub-tiles, one query block
    C(1.0, False, 128, 128, 32, H=4, Hkv=1, alibi="heads"),  # the bound
    C(1.5, True, 129, 129, 32, alibi="heads", q_scale=True),  # one past it: the multi-pass path
]


@pytest.mark.parametrize("case", SHORT_CASES, ids=case_id)
def test_short_rows_match_reference(case):
    """Forward, aux and gradients vs fp64, through the public function; the launched forward variant is the
    single-tile one up to 128 keys, the multi-pass one beyond."""
    with recorded_forward_variants() as launched:
        check_case(case)
    assert launched.keys == [expected_keys(case["Nk"], case["D"])], launched.keys


@pytest.mark.parametrize("case", SHORT_CASES[:-1], ids=case_id)
def test_short_rows_by_multi_pass_path(case, monkeypatch):
    """The same short rows through the public function with the launcher's single_tile=False: the
    multi-pass path, which these lengths no longer take by default, stays correct there."""
    from asentmax.ops.triton import attention as triton_attention
    from asentmax.ops.triton.attention_fwd import entmax_attention_fwd

    monkeypatch.setattr(triton_attention, "entmax_attention_fwd",
                        functools.partial(entmax_attention_fwd, single_tile=False))
    with recorded_forward_variants() as launched:
        check_case(case)
    assert launched.keys == [0], launched.keys


def test_launcher_picks_single_tile_at_training_shape():
    """The MQMTAR training shape (73-90 keys, head_dim 32) and shorter rows take the single-tile variant;
    longer rows, head_dim > 64 and single_tile=False the multi-pass one. Only the launch is recorded."""
    from asentmax.ops.triton import attention_fwd

    def launched_keys(n, dim, **options):
        q = torch.zeros(1, 1, n, dim)
        with recorded_forward_variants(run=False) as launched:
            attention_fwd.entmax_attention_fwd(
                q, q, q, mode=1, alpha=1.5, scale=1.0, causal=True, slopes=None, q_scale=None, kpm=None,
                write_o2=True, tol=3e-2, max_iter=40, blocks=forward_blocks(dim, n), **options)
        return launched.keys

    for n, dim in ((73, 32), (90, 32), (17, 32), (128, 64), (129, 32), (90, 100)):
        assert launched_keys(n, dim) == [expected_keys(n, dim)], (n, dim)
    assert launched_keys(90, 32, single_tile=False) == [0]


def fp64_tile_table_and_o2(q, k, v, options, alpha, blocks):
    """Oracle of the forward's tile table (max of s = c z over each (BLOCK_M, BLOCK_N) tile, (B, H, n_qb,
    n_kb), -inf where all hidden) and o2 = (g @ v) / sum g, g = p^(2-alpha), from the dense fp64 logits."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    z, empty = reference_logits(q64, k64, causal=options["causal"], scale=q.shape[-1] ** -0.5,
                                alibi_slopes=options.get("alibi_slopes"),
                                q_scale=options["q_scale"].double() if "q_scale" in options else None,
                                key_padding_mask=options.get("key_padding_mask"))
    s = (logit_constants(mode_of(alpha), alpha)[0] * z).masked_fill(empty, float("-inf"))
    block_m, block_n = blocks[:2]
    n_q, n_k = s.shape[-2:]
    pad_q, pad_k = -n_q % block_m, -n_k % block_n
    padded = torch.nn.functional.pad(s, (0, pad_k, 0, pad_q), value=float("-inf"))
    tiles = padded.unflatten(-1, (-1, block_n)).unflatten(-3, (-1, block_m)).amax((-3, -1))
    p = entmax(z, alpha=alpha, dim=-1).masked_fill(empty, 0.0)
    g = _gate(p, alpha)
    v64 = v64.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    o2 = (g @ v64) / g.sum(-1, keepdim=True).clamp_min(1e-300)
    return tiles, o2


@pytest.mark.parametrize("case", [
    C(1.5, True, 90, 90, 32, F16, B=2, H=4, Hkv=2, alibi="heads", q_scale=True, kpm=True),
    C(1.25, True, 20, 127, 40, F16, alibi="heads", q_scale=True, negative=True),
], ids=case_id)
def test_tile_table_and_o2_match_fp64(case):
    """The tile table (per BLOCK_N sub-tile of the register tile) and o2 (with the hi + lo split of g at
    16-bit inputs and q_scale) against the fp64 oracle, thresholds solved to fp32 precision, and no less
    accurate than the multi-pass path's on the same inputs; passes counted within [1, max_iter].
    negative: q.k < 0 for every pair, so that a tile max taken over the padding rows past Nq (q = 0, s = 0
    on the NoPE head) would show."""
    from asentmax.ops.triton.attention_fwd import entmax_attention_fwd

    q, k, v, options, _ = make_inputs(case)
    q, k, v = q.detach(), k.detach(), v.detach()
    if case.get("negative"):
        q, k = q.abs(), -k.abs()
    alpha = case["alpha"]
    blocks = forward_blocks(case["D"], case["Nq"])
    slopes = options["alibi_slopes"].expand(case["B"], -1).contiguous()
    kpm = options["key_padding_mask"].to(torch.uint8) if "key_padding_mask" in options else None
    q_scale = options["q_scale"].detach().float().contiguous()
    results = []
    for single_tile in (True, False):
        with poisoned_allocations():
            _, o2, _, _, _, tile_max, passes = entmax_attention_fwd(
                q, k, v, mode=mode_of(alpha), alpha=alpha, scale=case["D"] ** -0.5, causal=case["causal"],
                slopes=slopes, q_scale=q_scale, kpm=kpm, write_o2=True, tol=1e-6, max_iter=40, blocks=blocks,
                single_tile=single_tile)
        assert passes.min() >= 1 and passes.max() <= 40
        results.append((tile_max, o2))
    tiles_ref, o2_ref = fp64_tile_table_and_o2(q, k, v, dict(options, q_scale=q_scale), alpha, blocks)
    # the entries the forward writes: tiles with a key that may be causally visible to the query block
    n_qb, n_kb = tiles_ref.shape[-2:]
    first_key = torch.arange(n_kb)[None, :] * blocks[1]
    last_pos = (torch.arange(n_qb)[:, None] + 1) * blocks[0] - 1 + case["Nk"] - case["Nq"]
    written = (first_key <= last_pos) if case["causal"] else torch.ones(n_qb, n_kb, dtype=torch.bool)
    want = tiles_ref[:, :, written]
    live = torch.isfinite(want)
    for tile_max, _ in results:
        got = tile_max[:, :, written]
        assert torch.equal(torch.isinf(got), ~live), "tile table: exactly the all-hidden tiles are -inf"
        assert max_err(got[live], want[live]) <= 1e-5 * want[live].abs().max().item(), "tile table differs"
    errors = [max_err(o2, o2_ref) for _, o2 in results]
    assert errors[0] <= 2 * errors[1] + 1e-6, f"o2 error {errors[0]:.3g}, multi-pass {errors[1]:.3g}"
    assert errors[0] <= 1e-4 * o2_ref.abs().max().item(), errors


def test_max_iter_bounds_single_tile_iterations():
    """The single-tile path counts its Newton iterations as passes and stops at max_iter: one iteration
    gives one pass per query block and a less accurate output than the converged run."""
    from asentmax.ops.triton.attention_fwd import entmax_attention_fwd

    case = C(1.5, True, 90, 90, 32, B=1, H=2, alibi="heads")
    q, k, v, options, _ = make_inputs(case)
    q, k, v = q.detach(), k.detach(), v.detach()
    slopes = options["alibi_slopes"].expand(1, -1).contiguous()
    ref = entmax_attention(q.double(), k.double(), v.double(), backend="reference", **options)
    errors, counts = [], []
    for max_iter in (1, 40):
        out, *_, passes = entmax_attention_fwd(
            q, k, v, mode=1, alpha=1.5, scale=32 ** -0.5, causal=True, slopes=slopes, q_scale=None, kpm=None,
            write_o2=False, tol=1e-3, max_iter=max_iter, blocks=forward_blocks(32, 90))
        errors.append(max_err(out, ref))
        counts.append(passes)
    assert torch.equal(counts[0], torch.ones_like(counts[0]))
    assert counts[1].min() > 1 and counts[1].max() < 40
    assert errors[1] < 1e-5 < errors[0], errors
