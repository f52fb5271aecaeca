"""The decoding kernels (Nq <= 16, no gradients) vs the fp64 reference (docs/method.md section 3), on each of
their code paths. Caches of <= SHORT_CACHE keys (multi-head or grouped): the one-launch kernel
(attention_decode_short.py) with its threshold tile in registers or re-read from memory (many query rows).
Longer caches: the split-over-keys kernels (attention_decode.py), chunks of SPLIT_CHUNK keys (128 where
forced, so that short caches span many): one chunk (output written directly), several chunks (partial outputs
summed by the pack's last program), thresholds by their own launch (a score row held in registers, <= 4096
keys, or streamed) or solved in the output kernel. Grouped-query attention: the split path packs the query
heads of a KV head into one program (heads_per_program); GQA_CASES check each layout on both paths, forced,
and SPLIT_GQA_CASES the split path's defaults at groups 2, 4, 8 and MHA over caches of 1 to 4100 keys, with
NAPE slopes (ALiBi on half the heads) and q_scale. The interpreter tests run under TRITON_INTERPRET=1 with
every buffer the launchers allocate NaN-poisoned; the `gpu` ones repeat the check in bf16 (and fp32) at
decoding sizes on a CUDA device.
"""

import os

import pytest
import torch

from asentmax.ops.attention import entmax_attention
from conftest import nan_poisoned_empty

pytest.importorskip("triton")
interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="interpreter tests: run with TRITON_INTERPRET=1")
on_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                             reason="needs a CUDA device (and no TRITON_INTERPRET)")

FLOOR = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def inputs(b, h, hkv, nq, nk, d, dtype, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, heads, n, d, generator=gen).to(device=device, dtype=dtype)
               for heads, n in ((h, nq), (hkv, nk), (hkv, nk)))
    mask = torch.rand(b, nk, generator=gen) > 0.3
    mask[0, -1] = True  # batch 0 sees a key (a single-key cache would be masked out 30% of the time)
    if b > 1:
        mask[1] = False  # a batch whose rows have no visible key
    slopes = torch.tensor([1.0 / (i + 1) if i < h // 2 else 0.0 for i in range(h)]) * 0.01
    q_scale = (1.0 + torch.rand(b, h, nq, generator=gen)).to(dtype)
    return q, k, v, {name: x.to(device) for name, x in
                     dict(key_padding_mask=mask, alibi_slopes=slopes, q_scale=q_scale).items()}


def check_decode(case, device="cpu"):
    alpha, causal, b, h, hkv, nq, nk, d, dtype, extras = case
    q, k, v, all_options = inputs(b, h, hkv, nq, nk, d, dtype, device=device)
    options = dict(alpha=alpha, causal=causal, **{name: all_options[name] for name in extras})
    with torch.no_grad():
        with nan_poisoned_empty():
            out, aux = entmax_attention(q, k, v, backend="triton", return_aux=True, **options)
        ref_options = {name: x.double() if name == "q_scale" else x for name, x in options.items()}
        ref, ref_aux = entmax_attention(q.double(), k.double(), v.double(), backend="reference",
                                        return_aux=True, **ref_options)
        low = entmax_attention(q, k, v, backend="reference", **options)
    assert out.dtype == dtype and out.shape == (b, h, nq, d)
    assert torch.isfinite(out).all()
    err, low_err = (out.double() - ref).abs().max().item(), (low.double() - ref).abs().max().item()
    assert err <= 2 * low_err + FLOOR[dtype], f"out error {err:.3g}, reference in {dtype}: {low_err:.3g}"
    empty = torch.isinf(ref_aux.tau)
    assert torch.equal(torch.isinf(aux.tau), empty)
    assert (out[empty] == 0).all(), "rows with no visible key must output 0"
    assert (aux.tau[~empty] - ref_aux.tau[~empty]).abs().max().item() <= 1e-3
    if alpha == 1.0:  # softmax: every visible key, exactly
        assert torch.equal(aux.support_size, ref_aux.support_size), "softmax: support = every visible key"
    gap = (aux.support_size.long() - ref_aux.support_size.long()).abs().max().item()
    assert gap <= max(1, int(0.02 * ref_aux.support_size.max().item())), f"support sizes differ by {gap}"


def case_id(case):
    return f"a{case[0]}-B{case[2]}-H{case[3]}/{case[4]}-Nq{case[5]}-Nk{case[6]}-D{case[7]}-{str(case[8])[6:]}"


ALL = ("key_padding_mask", "alibi_slopes", "q_scale")
# bf16 runs on the GPU only (GPU_CASES): the triton 3.6 interpreter's tl.dot on bf16 operands returns garbage.
CASES = [  # (alpha, causal, B, H, Hkv, Nq, Nk, D, dtype, extras); B = 2 with the mask: batch 1 sees no key
    # one launch (Nk <= SHORT_CACHE = 2048), a program per query head, grouped (Hkv < H) or not; threshold
    # tile rows x keys in registers up to 4096, else re-read
    (1.5, True, 2, 4, 2, 1, 1, 16, torch.float32, ALL),  # a single key, GQA
    (1.0, True, 2, 2, 1, 1, 17, 16, torch.float32, ("key_padding_mask", "q_scale")),  # softmax
    (1.25, True, 1, 4, 4, 4, 17, 32, torch.float16, ("alibi_slopes", "q_scale")),  # causal offset, 4 rows
    (2.0, False, 2, 2, 2, 3, 1000, 48, torch.float32, ("key_padding_mask", "alibi_slopes")),
    (1.5, True, 2, 4, 1, 16, 1000, 64, torch.float16, ALL),  # 16 rows: re-read threshold tile, GQA 4
    (1.75, True, 1, 2, 2, 7, 1024, 16, torch.float32, ()),
    (1.25, True, 1, 2, 1, 16, 2047, 100, torch.float16, ("q_scale", "alibi_slopes")),
    (2.0, False, 2, 1, 1, 3, 1999, 48, torch.float32, ("key_padding_mask", "q_scale")),
    (1.5, True, 1, 2, 2, 4, 2048, 16, torch.float32, ("q_scale",)),  # the longest cache; 4 rows re-read
    (1.0, False, 2, 2, 1, 1, 2048, 16, torch.float32, ("alibi_slopes", "key_padding_mask")),  # resident
    # split over keys (Nk > SHORT_CACHE), chunks of SPLIT_CHUNK = 1024 keys
    (1.25, True, 2, 2, 1, 2, 2049, 16, torch.float32, ALL),  # just past the one-launch path, GQA
    (1.5, True, 2, 1, 1, 2, 6000, 16, torch.float32, ("key_padding_mask",)),  # 6 chunks, streamed rows
    (1.0, False, 1, 2, 2, 1, 4097, 16, torch.float32, ("alibi_slopes",)),  # softmax, streamed
]


@interpreter
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_decode_matches_reference(case):
    check_decode(case)


# grouped-query attention, the heads sharing a KV head in one program: group 2, 3, 4, 8 (with Nq = 4 a group
# of 8 takes two programs of 4 heads); ALiBi slopes differ between the heads of a pack (inputs: heads < H / 2)
GQA_CASES = [  # (alpha, causal, B, H, Hkv, Nq, Nk, D, dtype, extras)
    (1.5, True, 2, 8, 4, 1, 77, 32, torch.float32, ALL),  # group 2
    (2.0, True, 1, 8, 2, 3, 300, 64, torch.float32, ALL),  # group 4, 12 rows: re-read threshold tile
    (1.5, False, 2, 8, 1, 1, 130, 128, torch.float16, ALL),  # group 8 in one program
    (1.0, True, 1, 4, 1, 4, 100, 64, torch.float32, ALL),  # softmax, group 4 x Nq 4 = 16 rows
    (1.25, True, 1, 8, 1, 4, 50, 32, torch.float32, ("alibi_slopes", "q_scale")),  # group 8, packs of 4
    (1.5, True, 1, 6, 2, 5, 90, 48, torch.float32, ("alibi_slopes", "q_scale")),  # group 3, 15 rows
    (2.0, True, 2, 4, 1, 2, 2100, 32, torch.float32, ALL),  # group 4, split: 3 chunks of 1024 keys, summed
]


@interpreter
@pytest.mark.parametrize("path", ["short", "short-packed", "split"])
@pytest.mark.parametrize("case", GQA_CASES, ids=case_id)
def test_decode_gqa_packed_heads(monkeypatch, case, path):
    """Each path forced (takes_short_path replaced) on grouped heads: the split path packs them per KV head,
    the one-launch kernel takes a program per head, or (short-packed) the packs of heads_per_program that its
    `pack` option allows."""
    from asentmax.ops.triton import attention_decode
    from asentmax.ops.triton.attention_common import heads_per_program

    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: path != "split")
    if path == "short-packed":
        short = attention_decode.entmax_attention_decode_short

        def packed(q, k, v, **options):
            return short(q, k, v, pack=heads_per_program(q.shape[1] // k.shape[1], q.shape[2]), **options)

        monkeypatch.setattr(attention_decode, "entmax_attention_decode_short", packed)
    check_decode(case)


@interpreter
@pytest.mark.parametrize("path, n_q", [("short", 1), ("split", 2), ("fused", 20)])
def test_cache_buffer_views_equal_contiguous(monkeypatch, path, n_q):
    """k, v as asentmax.nn.KVCache returns them (the filled slots of NaN-filled buffers with room for more,
    not contiguous) give exactly the output of contiguous copies: the kernels follow the strides and read no
    slot beyond the filled ones. fused: the prefill's forward kernel (more than 16 queries)."""
    from asentmax.ops.triton import attention_decode

    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: path == "short")
    monkeypatch.setattr(attention_decode, "SPLIT_CHUNK", 128)
    q, k, v, options = inputs(2, 8, 2, n_q, 300, 16, torch.float32)
    buffers = [torch.full((2, 2, 448, 16), float("nan")) for _ in range(2)]
    for buffer, filled in zip(buffers, (k, v), strict=True):
        buffer[:, :, :300] = filled
    k_view, v_view = (buffer[:, :, :300] for buffer in buffers)
    assert not k_view.is_contiguous()
    with torch.no_grad():
        got = entmax_attention(q, k_view, v_view, alpha=1.5, backend="triton", **options)
        want = entmax_attention(q, k, v, alpha=1.5, backend="triton", **options)
    assert torch.isfinite(want).all() and torch.equal(got, want)


# the split path's defaults on grouped caches (chunks of 128 keys here, so 1000 keys are 8 chunks and 4100
# keys 33, summed by two blocks of chunk_sum) and on MHA, alpha 1, 1.5, 2 and general
SPLIT_GQA_CASES = [  # (alpha, causal, B, H, Hkv, Nq, Nk, D, dtype, extras)
    (1.5, True, 2, 4, 2, 1, 1, 16, torch.float32, ALL),  # group 2, a single key
    (1.0, True, 2, 8, 2, 1, 17, 16, torch.float32, ALL),  # group 4, softmax, one chunk
    (2.0, False, 2, 8, 1, 1, 17, 16, torch.float32, ALL),  # group 8, sparsemax
    (1.5, True, 2, 4, 2, 2, 1000, 16, torch.float32, ALL),  # group 2, 8 chunks
    (1.25, True, 2, 8, 2, 1, 1000, 16, torch.float32, ALL),  # group 4
    (1.0, False, 1, 8, 1, 1, 1000, 16, torch.float32, ("alibi_slopes", "q_scale")),  # group 8, softmax; the
    # output kernel solves 8 rows x 1024 keys re-read from L2 (in registers up to 4096 scores)
    (1.5, True, 2, 8, 1, 1, 1000, 16, torch.float32, ALL),  # group 8
    (1.5, True, 2, 4, 4, 1, 1000, 16, torch.float32, ALL),  # MHA
    (1.75, True, 2, 8, 2, 1, 4100, 16, torch.float32, ALL),  # group 4, 33 chunks, threshold launch, streamed
    (1.5, True, 1, 8, 1, 2, 4096, 16, torch.float32, ("alibi_slopes", "q_scale")),  # group 8 x Nq 2
    (2.0, True, 1, 2, 2, 1, 4096, 16, torch.float32, ("alibi_slopes", "q_scale")),  # MHA, split (> 2048)
]


@interpreter
@pytest.mark.parametrize("case", SPLIT_GQA_CASES, ids=case_id)
def test_decode_split_path(monkeypatch, case):
    """The split path (forced: the launcher takes the one-launch kernel up to 2048 keys) with its default
    threshold solving, on chunks of 128 keys (SPLIT_CHUNK replaced: many chunks at the interpreter's short
    caches)."""
    from asentmax.ops.triton import attention_decode

    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: False)
    monkeypatch.setattr(attention_decode, "SPLIT_CHUNK", 128)
    check_decode(case)


@interpreter
@pytest.mark.parametrize("path, option", [("short", dict(pack=4)), ("split", dict(pack=1)),
                                          ("split", dict(chunk=256)), ("split", dict(solve=False))],
                         ids=["short-pack4", "split-pack1", "split-chunk256", "split-threshold-launch"])
def test_decode_launcher_options(path, option):
    """The launchers' options that bench_decode_gpu.py times (the layout the launcher does not take: packs of
    4 heads on the one-launch path, a program per head on the split path; chunk=256: two chunks here, not
    the default's one; solve=False: the thresholds by their own launch, where the default solves these 8
    rows x 384 keys in the output kernel, held in registers) compute what the defaults compute, which
    test_decode_gqa_packed_heads checks against the reference."""
    from asentmax.ops.triton import attention_decode

    launcher = getattr(attention_decode, f"entmax_attention_decode_{path}")
    q, k, v, extras = inputs(2, 8, 2, 2, 300, 32, torch.float32)
    slopes = extras["alibi_slopes"].expand(2, 8).contiguous()
    options = dict(mode=1, alpha=1.5, scale=32 ** -0.5, causal=True, slopes=slopes, q_scale=extras["q_scale"],
                   kpm=extras["key_padding_mask"].view(torch.uint8), tol=1e-3, max_iter=40)
    default, optioned = launcher(q, k, v, **options), launcher(q, k, v, **option, **options)
    assert torch.allclose(default[0], optioned[0], atol=1e-5)
    assert torch.allclose(default[1], optioned[1], atol=1e-5)


# the one-launch kernel's tuning knobs (benchmarks/tune_decode_gpu.py): tiles smaller and larger than the
# default's, on caches that are not a whole number of tiles (77 keys: less than one), grouped, with every
# extra; packed: the programs of heads_per_program (packs of 2 heads here)
GROUPED_600 = (1.5, True, 2, 4, 2, 1, 600, 32, torch.float32, ALL)
PAIR_77 = (2.0, False, 2, 2, 1, 3, 77, 64, torch.float32, ALL)
KNOB_CASES = [  # (case, knobs, packed)
    (GROUPED_600, dict(block_n=32, num_warps=8, num_stages=1), False),
    (GROUPED_600, dict(block_n=256, num_warps=8, num_stages=2), True),
    (GROUPED_600, dict(block_n=512, num_warps=8, num_stages=1), False),
    (PAIR_77, dict(block_n=32, num_warps=8, num_stages=2), True),
    (PAIR_77, dict(block_n=256, num_warps=8, num_stages=1), False),
    (PAIR_77, dict(block_n=512, num_warps=8, num_stages=2), False),
]

@interpreter
@pytest.mark.parametrize("case, knobs, packed", KNOB_CASES,
                         ids=[f"{case_id(c)}-{k['block_n']}/{k['num_warps']}/{k['num_stages']}"
                              + ("-packed" if p else "") for c, k, p in KNOB_CASES])
def test_decode_short_tuning_knobs(monkeypatch, case, knobs, packed):
    """The one-launch kernel (forced) with block_n, num_warps and num_stages set matches the reference."""
    from asentmax.ops.triton import attention_decode
    from asentmax.ops.triton.attention_common import heads_per_program

    short = attention_decode.entmax_attention_decode_short

    def tuned(q, k, v, **options):
        pack = heads_per_program(q.shape[1] // k.shape[1], q.shape[2]) if packed else 1
        return short(q, k, v, pack=pack, **knobs, **options)

    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: True)
    monkeypatch.setattr(attention_decode, "entmax_attention_decode_short", tuned)
    check_decode(case)


@pytest.mark.parametrize("kv_heads, n_k, dim, knobs, launch", [
    # 600 keys, fewer than TUNED_CACHE: the untuned defaults, D 128: tiles of 64 keys, threshold_tile's warps
    (2, 600, 128, dict(), dict(BLOCK_N=64, num_warps=4, s_stride=640)),
    (2, 600, 128, dict(block_n=512), dict(BLOCK_N=512, num_warps=4, s_stride=1024)),
    (2, 600, 128, dict(block_n=256, num_warps=8, num_stages=1),
     dict(BLOCK_N=256, num_warps=8, num_stages=1, s_stride=768)),
    (2, 600, 128, dict(block_n=16, num_stages=3), dict(BLOCK_N=16, num_warps=4, num_stages=3, s_stride=608)),
    # TUNED_CACHE keys and more: tuned_launch's, each knob still overriding its own part
    (2, 1100, 128, dict(), dict(BLOCK_N=256, num_warps=4, num_stages=3, s_stride=1280)),  # multi-head
    (1, 1100, 128, dict(), dict(BLOCK_N=256, num_warps=8, num_stages=3, s_stride=1280)),  # grouped
    (1, 1024, 64, dict(), dict(BLOCK_N=512, num_warps=4, num_stages=3, s_stride=1024)),
    (2, 1100, 48, dict(num_stages=1), dict(BLOCK_N=512, num_warps=4, num_stages=1, s_stride=1536)),
    (1, 1100, 100, dict(block_n=64, num_warps=2), dict(BLOCK_N=64, num_warps=2, num_stages=3, s_stride=1152)),
    (2, 1100, 256, dict(), dict(BLOCK_N=64, num_warps=8, s_stride=1152)),  # D > 128: untuned (tile of 1152)
    # fp32: the tuned tiles hold half as many keys (the same bytes), the rest as in bf16
    (1, 1024, 64, dict(dtype=torch.float32), dict(BLOCK_N=256, num_warps=4, num_stages=3, s_stride=1024)),
    (1, 1100, 128, dict(dtype=torch.float32), dict(BLOCK_N=128, num_warps=8, num_stages=3, s_stride=1152)),
    (2, 600, 64, dict(dtype=torch.float32), dict(BLOCK_N=128, num_warps=4, s_stride=640)),  # untuned
])
def test_decode_short_knobs_reach_the_kernel(monkeypatch, kv_heads, n_k, dim, knobs, launch):
    """The knobs, else tuned_launch's defaults (caches of >= TUNED_CACHE keys, head dims <= 128; bf16 unless
    the case says fp32), else the untuned ones become the kernel's BLOCK_N and launch options (num_stages
    only where set), and the score rows hold whole tiles: s_stride = Nk rounded up to a multiple of
    BLOCK_N."""
    import inspect

    from asentmax.ops.triton import attention_decode_short as short

    signature = inspect.signature(short._decode_short.fn)
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch_kernel(*args, num_warps, **kwargs):
                stages = {"num_stages": kwargs.pop("num_stages")} if "num_stages" in kwargs else {}
                bound = signature.bind(*args, **kwargs).arguments
                seen.update(BLOCK_N=bound["BLOCK_N"], num_warps=num_warps, s_stride=bound["s_stride"],
                            **stages)
            return launch_kernel

    monkeypatch.setattr(short, "_decode_short", Recorder())
    knobs = dict(knobs)
    dtype = knobs.pop("dtype", torch.bfloat16)
    q, k = torch.zeros(1, 2, 1, dim, dtype=dtype), torch.zeros(1, kv_heads, n_k, dim, dtype=dtype)
    short.entmax_attention_decode_short(q, k, k, mode=1, alpha=1.5, scale=0.125, causal=True, slopes=None,
                                        q_scale=None, kpm=None, tol=1e-3, max_iter=40, **knobs)
    assert seen == launch


@pytest.mark.parametrize("knobs, message", [
    (dict(block_n=8), "block_n must be a power of two >= 16"), (dict(block_n=96), "block_n"),
    (dict(num_warps=3), "num_warps must be a power of two"), (dict(num_warps=64), "num_warps"),
    (dict(num_stages=0), "num_stages must be >= 1")])
def test_decode_short_refuses_bad_knobs(knobs, message):
    from asentmax.ops.triton.attention_decode_short import entmax_attention_decode_short

    q, k = torch.empty(1, 2, 1, 64, device="meta"), torch.empty(1, 2, 100, 64, device="meta")
    with pytest.raises(ValueError, match=message):
        entmax_attention_decode_short(q, k, k, mode=1, alpha=1.5, scale=0.125, causal=True, slopes=None,
                                      q_scale=None, kpm=None, tol=1e-3, max_iter=40, **knobs)


@pytest.mark.parametrize("group, n_q, pack", [(1, 1, 1), (1, 16, 1), (2, 1, 2), (4, 4, 4), (8, 1, 8),
                                               (8, 4, 4), (3, 5, 3), (6, 3, 3), (16, 1, 16), (16, 2, 8),
                                               (4, 16, 1)])
def test_heads_per_program(group, n_q, pack):
    """The largest divisor of the group whose pack * Nq rows fit MAX_QUERIES = 16."""
    from asentmax.ops.triton.attention_common import heads_per_program

    assert heads_per_program(group, n_q) == pack


def launch_grids(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim):
    """{kernel name: grid} of the launches entmax_attention_decode makes for these shapes (kernels replaced
    by recorders: nothing runs)."""
    from asentmax.ops.triton import attention_decode, attention_decode_short

    grids = {}

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            grids[self.name] = grid
            return lambda *args, **kwargs: None

    monkeypatch.setattr(attention_decode_short, "_decode_short", Recorder("_decode_short"))
    for name in ("_decode_scores", "_decode_threshold", "_decode_output"):
        monkeypatch.setattr(attention_decode, name, Recorder(name))
    q, k = torch.zeros(batch, heads, n_q, dim), torch.zeros(batch, kv_heads, n_k, dim)
    attention_decode.entmax_attention_decode(q, k, k, mode=1, alpha=1.5, scale=0.25, causal=True, slopes=None,
                                             q_scale=None, kpm=None, tol=1e-3, max_iter=40)
    return grids


@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k, dim, grid", [
    (3, 8, 8, 1, 100, 64, {"_decode_short": (24,)}),  # MHA, short cache: a program per query head
    (3, 8, 8, 1, 3000, 64, {"_decode_scores": (3, 24), "_decode_output": (3, 24)}),  # 3 chunks x 24 packs
    (3, 8, 2, 1, 100, 64, {"_decode_short": (24,)}),  # grouped, short cache: a program per query head
    (3, 8, 2, 1, 3000, 64, {"_decode_scores": (3, 6), "_decode_output": (3, 6)}),
    (8, 16, 4, 1, 1024, 128, {"_decode_short": (128,)}),
    (8, 16, 4, 1, 2048, 128, {"_decode_short": (128,)}),  # SHORT_CACHE, the longest
    # WIDE_SHORT_CACHE: one query a head in groups of <= 4, 128 query heads: one launch up to 4,096 keys
    (8, 16, 4, 1, 4096, 64, {"_decode_short": (128,)}),
    (8, 16, 16, 1, 4096, 64, {"_decode_short": (128,)}),
    (4, 16, 4, 1, 4096, 64, {"_decode_scores": (4, 16), "_decode_output": (4, 16)}),  # 64 query heads
    (8, 16, 4, 4, 4096, 64, {"_decode_scores": (4, 32), "_decode_threshold": (512,),
                             "_decode_output": (4, 32)}),
    (4, 16, 16, 1, 4096, 64, {"_decode_scores": (4, 64), "_decode_output": (4, 64)}),
    (8, 16, 16, 1, 8192, 64, {"_decode_scores": (8, 128), "_decode_threshold": (128,),
                              "_decode_output": (8, 128)}),
    (8, 32, 4, 4, 3000, 128, {"_decode_scores": (3, 64), "_decode_threshold": (1024,),
                              "_decode_output": (3, 64)}),  # packs of 4, 16 rows
    (8, 32, 4, 1, 4096, 64, {"_decode_scores": (4, 32), "_decode_threshold": (256,),
                             "_decode_output": (4, 32)}),
    (2, 8, 4, 16, 500, 64, {"_decode_short": (16,)}),  # group 2 x Nq 16 rows
])
def test_decode_launch_grids(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim, grid):
    """The launcher's path and grids: the one-launch kernel (a program per (batch, query head)) up to
    SHORT_CACHE keys, multi-head or grouped, and up to WIDE_SHORT_CACHE for one query a head in groups of
    at most 4 with 128 query heads or more; else the split kernels, whose K- and V-reading programs run over
    (chunk of SPLIT_CHUNK = 1024 keys, batch, pack of query heads sharing a KV head), so each KV head is read
    once per pack, and a threshold program per query row, except where the output kernel solves them (no
    _decode_threshold launch): a pack's rows x padded cache <= 16384 scores, times the programs <= 2^22."""
    assert launch_grids(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim) == grid


@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k, dim, grid", [
    # grouped, 4K keys: 32 packs x 8 chunks of 512 = 256 programs; a pack's 4 x 4096 scores: threshold launch
    (8, 16, 4, 1, 4096, 64, {"_decode_scores": (8, 32), "_decode_threshold": (128,),
                             "_decode_output": (8, 32)}),
    # one sequence: 8 packs never reach 256 programs, so the smallest chunks (256 keys)
    (1, 32, 8, 1, 4096, 128, {"_decode_scores": (16, 8), "_decode_threshold": (32,),
                              "_decode_output": (16, 8)}),
    # one sequence at 1K: packs of 4 would give 4 chunks x 8 packs = 32 < GRAPH_PACKED_PROGRAMS programs, so
    # a head a program (32 x 4 chunks of 256), and its 1 x 1024 scores are solved by the output kernel
    (1, 32, 8, 1, 1024, 128, {"_decode_scores": (4, 32), "_decode_output": (4, 32)}),
    (8, 16, 4, 1, 2048, 128, {"_decode_scores": (8, 32), "_decode_threshold": (128,),
                              "_decode_output": (8, 32)}),
    (8, 32, 4, 1, 4096, 128, {"_decode_scores": (8, 32), "_decode_threshold": (256,),
                              "_decode_output": (8, 32)}),  # packs of 8
    # a pack of 2 rows x 1024 keys = GRAPH_SOLVE_SCORES: the output kernel solves (no threshold launch)
    (8, 8, 4, 1, 1024, 64, {"_decode_scores": (4, 32), "_decode_output": (4, 32)}),
    # 16 packs of 2 x 4 chunks = 64 = GRAPH_PACKED_PROGRAMS: packed; 8 packs x 4 = 32: a head a program
    (4, 8, 4, 1, 1024, 64, {"_decode_scores": (4, 16), "_decode_output": (4, 16)}),
    (2, 8, 4, 1, 1024, 64, {"_decode_scores": (4, 16), "_decode_output": (4, 16)}),
    # multi-head: 64 packs x 4 chunks of 1024 reach 256 programs (1 x 4096 scores: threshold launch); with
    # 128 query heads, one query each, one launch up to WIDE_SHORT_CACHE as when called directly
    (4, 16, 16, 1, 4096, 64, {"_decode_scores": (4, 64), "_decode_threshold": (64,),
                              "_decode_output": (4, 64)}),
    (8, 16, 16, 1, 4096, 64, {"_decode_short": (128,)}),
    (8, 16, 16, 1, 2048, 64, {"_decode_short": (128,)}),
    (8, 16, 4, 1, 1023, 64, {"_decode_short": (128,)}),  # grouped below GRAPH_SPLIT_CACHE: one launch
])
def test_decode_launch_grids_graphed(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim, grid):
    """Under CUDA-graph capture (graphed_launch replaced) the launcher's second rule: grouped caches from
    GRAPH_SPLIT_CACHE keys split, in the largest chunks of GRAPH_CHUNKS that give GRAPH_PROGRAMS = 256
    programs (else 256 keys), a head a program where packs would give fewer than GRAPH_PACKED_PROGRAMS = 64
    programs in chunks of 256, the thresholds in their own launch unless a pack's rows x padded cache are at
    most GRAPH_SOLVE_SCORES = 2048."""
    from asentmax.ops.triton import attention_decode

    monkeypatch.setattr(attention_decode, "graphed_launch", lambda q: True)
    assert launch_grids(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim) == grid


# the launcher's rule under CUDA-graph capture (graphed_launch replaced), at interpreter sizes: grouped caches
# from 1,024 keys split in chunks of 256 (few packs), in packs of heads or (too few of them) a head a program,
# thresholds in their own launch or solved by the output kernel (a pack of <= 2048 scores); multi-head caches
# past SHORT_CACHE likewise
GRAPHED_CASES = [  # (alpha, causal, B, H, Hkv, Nq, Nk, D, dtype, extras)
    (1.5, True, 4, 8, 4, 1, 1100, 32, torch.float32, ALL),  # 16 packs of 2 x 1280 scores: threshold launch
    (1.5, True, 2, 4, 2, 1, 1100, 32, torch.float32, ALL),  # packs of 2 too few: a head a program, solved
    (2.0, False, 2, 8, 4, 1, 1024, 16, torch.float32, ("alibi_slopes", "q_scale")),  # a head a program
    (1.0, True, 1, 4, 1, 4, 1500, 16, torch.float32, ALL),  # softmax, 16 rows a pack
    (1.25, True, 1, 2, 2, 1, 2100, 16, torch.float32, ("key_padding_mask",)),  # multi-head, 9 chunks
]


@interpreter
@pytest.mark.parametrize("case", GRAPHED_CASES, ids=case_id)
def test_decode_graphed_rule_matches_reference(monkeypatch, case):
    from asentmax.ops.triton import attention_decode

    monkeypatch.setattr(attention_decode, "graphed_launch", lambda q: True)
    check_decode(case)


@interpreter
@pytest.mark.parametrize("n_k", [1000, 4100])
def test_decode_rows_sum_to_one(n_k):
    """v = 1: each output entry is sum_j p_j / Z over all keys: 1 on rows with a visible key, else 0."""
    q, k, v, options = inputs(2, 1, 1, 2, n_k, 16, torch.float32, seed=3)
    with torch.no_grad():
        out, aux = entmax_attention(q, k, torch.ones_like(v), alpha=1.5, backend="triton", return_aux=True,
                                    key_padding_mask=options["key_padding_mask"])
    empty = torch.isinf(aux.tau)
    assert empty.any() and (~empty).any()
    assert torch.allclose(out[~empty], torch.ones(()), atol=1e-4)
    assert (out[empty] == 0).all()


@pytest.mark.parametrize("batch, heads, kv_heads, n_q, n_k, dim, graphed, path", [
    (1, 2, 2, 1, 1, 64, False, "short"), (1, 2, 2, 1, 2048, 64, False, "short"),
    (1, 2, 2, 1, 2049, 64, False, "split"), (1, 2, 2, 1, 40000, 64, False, "split"),
    (1, 2, 1, 1, 1, 64, False, "short"), (1, 2, 1, 1, 1024, 128, False, "short"),
    (1, 2, 1, 1, 2048, 128, False, "short"), (1, 2, 1, 1, 2049, 128, False, "split"),
    (1, 2, 2, 1, 2048, 64, True, "short"), (1, 2, 2, 1, 2049, 64, True, "split"),
    (1, 2, 1, 1, 1023, 64, True, "short"), (1, 2, 1, 1, 1024, 128, True, "split"),
    (1, 2, 1, 1, 2048, 64, True, "split"),
    # WIDE_SHORT_CACHE: one query a head, groups of <= 4, >= 128 query heads, up to 4,096 keys
    (8, 16, 4, 1, 4096, 64, False, "short"), (8, 16, 16, 1, 4096, 128, False, "short"),
    (8, 16, 4, 1, 4097, 64, False, "split"), (8, 16, 4, 4, 4096, 64, False, "split"),
    (8, 32, 4, 1, 4096, 128, False, "split"), (1, 32, 8, 1, 4096, 128, False, "split"),
    (4, 31, 31, 1, 4096, 64, False, "split"),
    (8, 16, 16, 1, 4096, 64, True, "short"), (8, 16, 4, 1, 4096, 64, True, "split")])
def test_decode_launcher_picks_path(monkeypatch, batch, heads, kv_heads, n_q, n_k, dim, graphed, path):
    """Caches of <= SHORT_CACHE keys take the one-launch kernel, longer ones the split over the keys, for
    multi-head and grouped caches at any head dim, except that one query a head in groups of at most 4
    with at least 128 query heads takes the one-launch kernel up to WIDE_SHORT_CACHE keys; under CUDA-graph
    capture (graphed_launch replaced) grouped caches of GRAPH_SPLIT_CACHE = 1024 keys or more split."""
    from asentmax.ops.triton import attention_decode

    assert attention_decode.SHORT_CACHE == 2048 and attention_decode.GRAPH_SPLIT_CACHE == 1024
    assert attention_decode.WIDE_SHORT_CACHE == 4096
    monkeypatch.setattr(attention_decode, "graphed_launch", lambda q: graphed)
    taken = []
    for name in ("short", "split"):
        monkeypatch.setattr(attention_decode, f"entmax_attention_decode_{name}",
                            lambda *args, name=name, **kwargs: taken.append(name))
    q = torch.empty(batch, heads, n_q, dim, device="meta")
    k = torch.empty(batch, kv_heads, n_k, dim, device="meta")
    attention_decode.entmax_attention_decode(q, k, k, mode=1, alpha=1.5, scale=0.25, causal=True, slopes=None,
                                             q_scale=None, kpm=None, tol=1e-3, max_iter=40)
    assert taken == [path]


@pytest.mark.parametrize("n_q, most", [(1, 2), (4, 3)])
def test_decode_short_compiles_few_variants(monkeypatch, n_q, most):
    """A cache growing from n_q to SHORT_CACHE keys launches the one-launch kernel with at most `most`
    compile-time configurations (constexprs and num_warps; the length-dependent ints are do_not_specialize),
    not one per length or per power of two."""
    from asentmax.ops.triton import attention_decode_short as short

    configs = set()

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: configs.add(tuple(sorted(kwargs.items())))

    monkeypatch.setattr(short, "_decode_short", Recorder())
    q = torch.zeros(1, 2, n_q, 64)
    for n_k in range(n_q, short.SHORT_CACHE + 1, 7):
        k = torch.zeros(1, 2, n_k, 64)
        short.entmax_attention_decode_short(q, k, k, mode=1, alpha=1.5, scale=0.125, causal=True, slopes=None,
                                            q_scale=None, kpm=None, tol=1e-3, max_iter=40)
    assert 1 < len(configs) <= most


@pytest.mark.parametrize("n_q", [1, 4])
def test_decode_split_compiles_few_variants(monkeypatch, n_q):
    """A grouped cache (B = 8, H = 16, Hkv = 4) growing to 8K keys on the split path (forced from 1 key on)
    launches its kernels with few compile-time configurations in all: one for the scores kernel (one chunk
    size); the output kernel with one chunk or several, solving its thresholds (in registers or re-read) or
    not; 2-3 threshold tiles. Each compiles once a process."""
    from asentmax.ops.triton import attention_decode

    configs = set()

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: configs.add((self.name, tuple(sorted(kwargs.items()))))

    for name in ("_decode_scores", "_decode_threshold", "_decode_output"):
        monkeypatch.setattr(attention_decode, name, Recorder(name))
    monkeypatch.setattr(attention_decode, "takes_short_path", lambda *shape: False)
    q = torch.zeros(8, 16, n_q, 64)
    zeros = torch.zeros(8 * 4 * 8192 * 64)  # each cache a contiguous view of its start (zeroed once)
    for n_k in range(n_q, 8193, 13):
        k = zeros[:8 * 4 * n_k * 64].view(8, 4, n_k, 64)
        attention_decode.entmax_attention_decode(q, k, k, mode=1, alpha=1.5, scale=0.125, causal=True,
                                                 slopes=None, q_scale=None, kpm=None, tol=1e-3, max_iter=40)
    assert sum(name == "_decode_scores" for name, _ in configs) == 1
    assert len(configs) <= 6


@pytest.mark.parametrize("batch, n_k", [(64, 40000), (2048, 2048)], ids=["split", "short"])
def test_decode_workspace_limit(batch, n_k):
    """The kernels index their workspace with int32: a larger problem is refused, not silently wrong, on
    both paths."""
    from asentmax.ops.triton.attention_decode import entmax_attention_decode

    q = torch.empty(batch, 64, 16, 64, device="meta")
    k = torch.empty(batch, 64, n_k, 64, device="meta")
    with pytest.raises(ValueError, match="exceeds 2\\^31"):
        entmax_attention_decode(q, k, k, mode=1, alpha=1.5, scale=0.125, causal=True, slopes=None,
                                q_scale=None, kpm=None, tol=1e-3, max_iter=40)


GPU_CASES = [(alpha, True, 2, 4, 2, nq, nk, dim, torch.bfloat16, ("key_padding_mask", "alibi_slopes"))
             for alpha in (1.0, 1.5, 1.25) for nq in (1, 4)
             for nk, dim in ((17, 64), (1000, 64), (3000, 128), (4096, 64), (20000, 64))] + [
    (alpha, True, 2, 16, 2, nq, nk, 128, torch.bfloat16, ALL)  # groups of 8: packs of 8 (Nq 1) and 4 (Nq 4)
    for alpha in (1.0, 1.5) for nq in (1, 4) for nk in (1000, 3000)] + [
    (1.5, True, 2, 4, 2, nq, nk, dim, torch.float32, ALL)  # fp32 on the tuned tiles (>= 1,024 keys) and split
    for nq in (1, 4) for nk, dim in ((1024, 64), (2048, 128), (3000, 64))]


@pytest.mark.gpu
@on_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_decode_matches_reference_gpu(case):
    check_decode(case, "cuda")


@pytest.mark.gpu
@on_cuda
@pytest.mark.parametrize("n_k, chunk", [(1000, 256), (20000, None)])
def test_decode_split_sum_race_free_gpu(n_k, chunk):
    """The split path's last program per pack sums the chunks' partials after an atomic count: with the
    workspace NaN-poisoned on every call, 30 calls at B * Hkv = 64 packs of 4 heads (4 chunks of 256 keys,
    20 of the default 1024) give finite outputs, bitwise equal (the sum runs in chunk order, whichever
    program arrives last); a partial read before it is stored would be NaN or differ."""
    from asentmax.ops.triton.attention_decode import entmax_attention_decode_split

    q, k, v, _ = inputs(16, 16, 4, 1, n_k, 64, torch.bfloat16, device="cuda")
    options = dict(mode=1, alpha=1.5, scale=0.125, causal=False, slopes=None, q_scale=None, kpm=None,
                   tol=3e-2, max_iter=40, chunk=chunk)
    with torch.no_grad(), nan_poisoned_empty():
        outs = [entmax_attention_decode_split(q, k, v, **options)[0] for _ in range(30)]
    assert torch.isfinite(outs[0]).all()
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


@pytest.mark.gpu
@on_cuda
@pytest.mark.parametrize("batch, heads, kv_heads, n_k, dim", [
    (8, 16, 4, 4096, 64), (1, 32, 8, 1024, 128), (8, 16, 4, 2048, 128), (4, 16, 16, 4096, 64)])
def test_decode_in_cuda_graph_gpu(monkeypatch, batch, heads, kv_heads, n_k, dim):
    """A decoding call captured into a CUDA graph takes the launcher's graph rule (split_chunk sees the
    capture) and its replay matches the fp64 reference as closely as the direct call does."""
    from asentmax.ops.triton import attention_decode

    seen = []
    chunk_rule = attention_decode.split_chunk
    monkeypatch.setattr(attention_decode, "split_chunk",
                        lambda *args: seen.append(args[-1]) or chunk_rule(*args))
    q, k, v, options = inputs(batch, heads, kv_heads, 1, n_k, dim, torch.bfloat16, device="cuda")
    options = dict(alpha=1.5, causal=False, alibi_slopes=options["alibi_slopes"])
    with torch.no_grad():
        direct = entmax_attention(q, k, v, backend="triton", **options)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            entmax_attention(q, k, v, backend="triton", **options)  # warm-up: compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graphed = entmax_attention(q, k, v, backend="triton", **options)
        graph.replay()
        torch.cuda.synchronize()
        ref = entmax_attention(q.double(), k.double(), v.double(), backend="reference", **options)
    assert seen[-1] is True
    direct_err = (direct.double() - ref).abs().max().item()
    graphed_err = (graphed.double() - ref).abs().max().item()
    assert graphed_err <= 2 * direct_err + FLOOR[torch.bfloat16], (graphed_err, direct_err)
