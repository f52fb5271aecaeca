"""GPU benchmark of the fused Triton entmax attention vs torch SDPA (flash, softmax) and AdaSplash.

Side by side in one run on one GPU, bf16, B=2, H=16, causal: forward and forward+backward times (medians of
triton.testing.do_bench), effective TFLOP/s (dense causal attention FLOPs: 2 matmuls forward, 5 backward,
halved for causality), block sparsity (share of causally visited tiles that were all-zero and skipped),
peak memory, on (a) random Gaussian q, k, v and (b) the same with NAPE ALiBi slopes (locality-structured
logits: heads 0..H/2-1 slopes 1, 1/2, ..., the rest 0). AdaSplash has no ALiBi, so it runs on (a) only.
Also: decoding (q_len = 1 against a long cache), the time of the first call at a new length, and the GPU
ceilings (device copy bandwidth, bf16 matmul rate) measured in the same run.

    python benchmarks/bench_attention_gpu.py --out results/attention_gpu
writes results/attention_gpu.json and results/attention_gpu.md.

--short runs only the short-sequence table instead, at the MQMTAR training shape (B=512, H=16 of which half
ALiBi and half NoPE, D=32, N=73 and 90, bf16, causal): the fused kernels' forward (with o2, as in training)
and forward+backward for entmax (alpha 1.5) and ASEntmax-style (alpha 1.5 with q_scale), by the forward's
single-tile path and by its multi-pass path (the launcher's single_tile=False), the public entmax_attention
call (its default path, host work included), and torch SDPA (default dispatch, flash, cuDNN; softmax,
no ALiBi) side by side in the same run:

    python benchmarks/bench_attention_gpu.py --short --out results/attention_gpu_short

--dtypes runs only the input-dtype table instead (B=2, H=16, causal, alpha 1.5, NAPE slopes, --dtype-lengths,
--dtype-dims): entmax_attention with autograd on the triton backend in bf16, fp16 and fp32 (ieee dots) and on
the chunked backend in fp32 and bf16, forward and forward+backward, and the wall seconds of each triton
dtype's first call (its kernels compiled), side by side in one run: the question results/fp32_kernels_sm90.md
leaves open (fp32 fused kernels spill registers; is chunked the faster fp32 path?):

    python benchmarks/bench_attention_gpu.py --dtypes --out results/attention_gpu_dtypes
"""

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from asentmax.ops.attention import entmax_attention
from asentmax.ops.triton.attention import _MAX_NEWTON_PASSES, _TOL
from asentmax.ops.triton.attention_bwd import entmax_attention_bwd
from asentmax.ops.triton.attention_common import forward_blocks, kernel_blocks, mode_of
from asentmax.ops.triton.attention_fwd import entmax_attention_fwd, register_tile_keys


def bench(fn, grad_to_none=None):
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def ceilings():
    x = torch.randn(2**29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    copy_ms = bench(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = bench(lambda: a @ b)
    return dict(copy_TBps=2 * x.numel() * 2 / copy_ms / 1e9, bf16_matmul_TFLOPs=2 * 8192**3 / mm_ms / 1e9)


def nape_slopes(heads):
    return torch.tensor([1.0 / (i + 1) if i < heads // 2 else 0.0 for i in range(heads)], device="cuda")


def attention_flops(batch, heads, n, dim, backward):
    fwd = 4 * batch * heads * n * n * dim / 2  # causal
    return fwd * 3.5 if backward else fwd


def block_sparsity(q, k, v, slopes):
    """Share of the causally visited (BLOCK_M, BLOCK_N) tiles whose weights are all 0 (skipped)."""
    blocks = forward_blocks(q.shape[-1], q.shape[2])
    _, _, tau, _, _, tile_max, _ = entmax_attention_fwd(
        q, k, v, mode=mode_of(1.5), alpha=1.5, scale=q.shape[-1] ** -0.5, causal=True,
        slopes=None if slopes is None else slopes.expand(q.shape[0], -1).contiguous(), q_scale=None, kpm=None,
        write_o2=False, tol=1e-3, max_iter=40, blocks=blocks)
    bm, bn = blocks[:2]
    n_qb, n_kb = tile_max.shape[-2:]
    pad = n_qb * bm - tau.shape[-1]
    tau_min = F.pad(tau, (0, pad), value=float("inf")).view(*tau.shape[:2], n_qb, bm).amin(-1)
    rows_end = torch.arange(1, n_qb + 1, device="cuda") * bm
    visited = torch.arange(n_kb, device="cuda")[None, :] * bn < rows_end[:, None]
    skipped = (tile_max <= tau_min[..., None]) & visited
    return skipped.sum().item() / (visited.sum().item() * tau.shape[0] * tau.shape[1])


def run_case(name, fn, inputs, flops, do_grad, row):
    for x in inputs:
        x.requires_grad_(do_grad)
    if do_grad:
        d_out = torch.randn_like(inputs[0])

        def step():
            fn().backward(d_out)
        ms = bench(step, grad_to_none=inputs)
    else:
        with torch.no_grad():
            ms = bench(fn)
    row[f"{name}_ms"] = ms
    row[f"{name}_TFLOPs"] = flops / ms / 1e9


def peak_memory_mb(fn, inputs):
    for x in inputs:
        x.requires_grad_(True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn().backward(torch.ones_like(inputs[0]))
    torch.cuda.synchronize()
    for x in inputs:
        x.grad = None
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_attention(b, h, dim, n, kind, adasplash_v2):
    """One row of the main table: ours vs SDPA (and AdaSplash-2 on random inputs when given)."""
    q, k, v = (torch.randn(b, h, n, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = nape_slopes(h) if kind == "nape" else None
    row = dict(D=dim, N=n, inputs=kind)

    def ours():
        return entmax_attention(q, k, v, alpha=1.5, causal=True, alibi_slopes=slopes, backend="triton")

    def sdpa():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    cases = [("ours", ours), ("sdpa", sdpa)]
    if adasplash_v2 is not None and kind == "random":
        cases.append(("adasplash2", lambda: adasplash_v2(q, k, v)))
    for name, fn in cases:
        for do_grad in (False, True):
            label = f"{name}_{'fwdbwd' if do_grad else 'fwd'}"
            run_case(label, fn, (q, k, v), attention_flops(b, h, n, dim, do_grad), do_grad, row)
    row["block_sparsity"] = block_sparsity(q, k, v, slopes)
    if n >= 4096:
        row["ours_peak_MB"] = peak_memory_mb(ours, (q, k, v))
        row["sdpa_peak_MB"] = peak_memory_mb(sdpa, (q, k, v))
    for key in ("fwd", "fwdbwd"):
        row[f"ours_vs_sdpa_{key}"] = row[f"ours_{key}_ms"] / row[f"sdpa_{key}_ms"]
        if f"adasplash2_{key}_ms" in row:
            row[f"ours_vs_adasplash2_{key}"] = row[f"ours_{key}_ms"] / row[f"adasplash2_{key}_ms"]
    print({key: (round(val, 4) if isinstance(val, float) else val) for key, val in row.items()}, flush=True)
    return row


def bench_decode(b, h, dim, cache):
    """q_len = 1 against a cache of `cache` keys: ours vs SDPA, and the K+V bytes read per second."""
    q = torch.randn(b, h, 1, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, h, cache, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        ours_ms = bench(lambda: entmax_attention(q, k, v, alpha=1.5, causal=True, backend="triton"))
        sdpa_ms = bench(lambda: F.scaled_dot_product_attention(q, k, v))
    kv_bytes = 2 * k.numel() * k.element_size()
    result = dict(B=b, H=h, D=dim, cache=cache, ours_ms=ours_ms, sdpa_ms=sdpa_ms,
                  ours_vs_sdpa=ours_ms / sdpa_ms, ours_TBps=kv_bytes / ours_ms / 1e9,
                  sdpa_TBps=kv_bytes / sdpa_ms / 1e9)
    print(result, flush=True)
    return result


def fused_kernels(q, k, v, slopes, q_scale, single_tile, alpha=1.5):
    """(forward, forward+backward, forward's passes) closures over the fused kernels' launchers as a
    training step calls them (o2 written, no support), without autograd or the custom ops' dispatch."""
    blocks, *backward_blocks = kernel_blocks(q.shape[-1], q.shape[2])
    options = dict(mode=mode_of(alpha), alpha=alpha, scale=q.shape[-1] ** -0.5, causal=True, slopes=slopes,
                   q_scale=q_scale, kpm=None)
    d_out = torch.randn_like(q)

    def forward():
        return entmax_attention_fwd(q, k, v, write_o2=True, write_support=False, tol=_TOL[q.dtype],
                                    max_iter=_MAX_NEWTON_PASSES, blocks=blocks, single_tile=single_tile,
                                    **options)

    def forward_backward():
        _, o2, tau, inv_z, _, tile_max, _ = forward()
        entmax_attention_bwd(d_out, q, k, v, o2, tau, inv_z, tile_max, blocks=blocks,
                             backward_blocks=backward_blocks, **options)

    return forward, forward_backward, lambda: forward()[-1]


def sdpa_backends():
    """[(name, backend or None for torch's own dispatch)] of torch SDPA for the short-sequence table."""
    backends = torch.nn.attention.SDPBackend
    return [("sdpa", None), ("sdpa_flash", backends.FLASH_ATTENTION),
            ("sdpa_cudnn", backends.CUDNN_ATTENTION)]


def bench_short(b, h, dim, n):
    """One row of the short-sequence table at the training shape: the fused kernels by the single-tile and
    the multi-pass path, entmax and ASEntmax-style (q_scale), the public call, and SDPA (softmax)."""
    q, k, v = (torch.randn(b, h, n, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    slopes = nape_slopes(h).expand(b, -1).contiguous()
    q_scale = 1.0 + torch.rand(b, h, n, device="cuda")
    row = dict(B=b, H=h, D=dim, N=n, keys_in_registers=register_tile_keys(n, dim, forward_blocks(dim, n)[1]))
    for variant, scales in (("entmax", None), ("asentmax", q_scale)):
        for path, single_tile in (("single", True), ("multi", False)):
            forward, forward_backward, passes = fused_kernels(q, k, v, slopes, scales, single_tile)
            row[f"{variant}_{path}_fwd_ms"] = bench(forward)
            row[f"{variant}_{path}_fwdbwd_ms"] = bench(forward_backward)
            row[f"{variant}_{path}_passes"] = passes().float().mean().item()

        def public(scales=scales):
            return entmax_attention(q, k, v, alpha=1.5, causal=True, alibi_slopes=slopes[0], q_scale=scales,
                                    backend="triton")
        for do_grad in (False, True):
            run_case(f"{variant}_public_{'fwdbwd' if do_grad else 'fwd'}", public, (q, k, v),
                     attention_flops(b, h, n, dim, do_grad), do_grad, row)
    for name, backend in sdpa_backends():
        def sdpa(backend=backend):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        try:
            for do_grad in (False, True):
                run_case(f"{name}_{'fwdbwd' if do_grad else 'fwd'}", sdpa, (q, k, v),
                         attention_flops(b, h, n, dim, do_grad), do_grad, row)
        except RuntimeError as exc:  # a backend this build or shape does not have
            row[f"{name}_error"] = str(exc).splitlines()[0][:120]
    print({key: (round(val, 4) if isinstance(val, float) else val) for key, val in row.items()}, flush=True)
    return row


DTYPE_CASES = (("triton", torch.bfloat16), ("triton", torch.float16), ("triton", torch.float32),
               ("chunked", torch.float32), ("chunked", torch.bfloat16))


def bench_dtypes(b, h, dim, n, compiled):
    """One row of the input-dtype table: entmax_attention (autograd, NAPE slopes) per (backend, dtype) of
    DTYPE_CASES; `compiled` holds the (dim, dtype)s whose triton kernels this run has compiled already."""
    slopes = nape_slopes(h)
    row = dict(B=b, H=h, D=dim, N=n)
    for backend, dtype in DTYPE_CASES:
        key = f"{backend}_{str(dtype).removeprefix('torch.')}"
        q, k, v = (torch.randn(b, h, n, dim, device="cuda", dtype=dtype) for _ in range(3))

        def call(q=q, k=k, v=v, backend=backend):
            return entmax_attention(q, k, v, alpha=1.5, causal=True, alibi_slopes=slopes, backend=backend)
        if backend == "triton" and (dim, dtype) not in compiled:
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            torch.cuda.synchronize()
            start = time.perf_counter()
            call(*leaves).sum().backward()
            torch.cuda.synchronize()
            row[f"{key}_first_call_s"] = time.perf_counter() - start
            compiled.add((dim, dtype))
        try:
            for do_grad in (False, True):
                run_case(f"{key}_{'fwdbwd' if do_grad else 'fwd'}", call, (q, k, v),
                         attention_flops(b, h, n, dim, do_grad), do_grad, row)
            row[f"{key}_peak_mb"] = peak_memory_mb(call, (q, k, v))
        except torch.OutOfMemoryError:
            row[f"{key}_error"] = "out of memory"
        del q, k, v
        torch.cuda.empty_cache()
    print({key: (round(val, 4) if isinstance(val, float) else val) for key, val in row.items()}, flush=True)
    return row


def time_first_call(batch, heads, n, note):
    """Wall-clock seconds of the first and the second fwd+bwd call at length n (D=64, bf16)."""
    q, k, v = (torch.randn(batch, heads, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    seconds = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        entmax_attention(q, k, v, alpha=1.5, backend="triton").sum().backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    result = dict(N=n, note=note, first_call_s=seconds[0], second_call_s=seconds[1])
    print(result, flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--adasplash-lengths", default="4096,16384",
                        help="lengths for AdaSplash (it autotunes per length: minutes each)")
    parser.add_argument("--decode-caches", default="4096,16384,65536")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--out", default="results/attention_gpu")
    parser.add_argument("--short", action="store_true",
                        help="only the short-sequence table at the training shape (--short-* options)")
    parser.add_argument("--short-lengths", default="73,90")
    parser.add_argument("--short-batch", type=int, default=512)
    parser.add_argument("--short-dim", type=int, default=32)
    parser.add_argument("--dtypes", action="store_true",
                        help="only the input-dtype table (--dtype-* options): triton by dtype vs chunked")
    parser.add_argument("--dtype-lengths", default="1024,4096")
    parser.add_argument("--dtype-dims", default="64,128")
    args = parser.parse_args()
    torch.manual_seed(0)
    b, h = args.batch, args.heads
    info = dict(command="python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, **ceilings())
    print(info, flush=True)
    report = dict(info=info, attention=[], decode=[], first_call=[], short=[], dtypes=[])

    def add(part, result):  # the files are rewritten after every result: a stopped run keeps what it measured
        report[part].append(result)
        with open(args.out + ".json", "w") as fh:
            json.dump(report, fh, indent=1)
        with open(args.out + ".md", "w") as fh:
            fh.write(markdown(report))

    if args.short:
        for n in (int(x) for x in args.short_lengths.split(",")):
            add("short", bench_short(args.short_batch, h, args.short_dim, n))
        print(markdown(report))
        return
    if args.dtypes:
        compiled = set()
        for dim in (int(d) for d in args.dtype_dims.split(",")):
            for n in (int(x) for x in args.dtype_lengths.split(",")):
                add("dtypes", bench_dtypes(b, h, dim, n, compiled))
        print(markdown(report))
        return
    try:
        from adasplash import adasplash_v2
    except ImportError:
        adasplash_v2 = None
    ada_lengths = {int(n) for n in args.adasplash_lengths.split(",") if n}
    add("first_call", time_first_call(b, h, 1024, "cold: compiles the kernels"))
    for dim in (int(d) for d in args.dims.split(",")):
        for n in (int(x) for x in args.lengths.split(",")):
            for kind in ("random", "nape"):
                peer = adasplash_v2 if n in ada_lengths else None
                add("attention", bench_attention(b, h, dim, n, kind, peer))
    for cache in (int(c) for c in args.decode_caches.split(",") if c):
        add("decode", bench_decode(8, h, 64, cache))
    for n in (5000, 12345):  # lengths not seen before: no compilation may happen
        add("first_call", time_first_call(b, h, n, "new length"))
    print(markdown(report))


def fmt(x, digits=3):
    if x is None:
        return "-"
    return f"{x:.{digits}g}" if isinstance(x, float) and math.isfinite(x) else str(x)


def markdown(report):
    info = report["info"]
    if report["short"]:
        return short_markdown(report)
    if report["dtypes"]:
        return dtypes_markdown(report)
    head = ("| D | N | inputs | ours fwd | SDPA fwd | Ada2 fwd | ours fwd+bwd | SDPA fwd+bwd "
            "| Ada2 fwd+bwd | ours/SDPA fwd | ours/SDPA f+b | ours/Ada2 f+b | ours TFLOP/s f+b | sparsity "
            "| peak MB ours/SDPA |")
    lines = [f"# Entmax attention on {info['gpu']} (torch {info['torch']}, triton {info['triton']})", "",
             f"Command: `{info['command']}`", "",
             f"Ceilings measured in the same run: copy {info['copy_TBps']:.2f} TB/s, "
             f"bf16 matmul {info['bf16_matmul_TFLOPs']:.0f} TFLOP/s.", "",
             "bf16, causal, alpha = 1.5 (ours, AdaSplash-2), softmax (SDPA flash). Times in ms (median); "
             "TFLOP/s counts dense causal attention FLOPs.", "",
             head, "|---" * 15 + "|"]
    for r in report["attention"]:
        peak = f"{fmt(r.get('ours_peak_MB'), 4)}/{fmt(r.get('sdpa_peak_MB'), 4)}"
        lines.append("| " + " | ".join([
            str(r["D"]), str(r["N"]), r["inputs"], fmt(r["ours_fwd_ms"]), fmt(r["sdpa_fwd_ms"]),
            fmt(r.get("adasplash2_fwd_ms")), fmt(r["ours_fwdbwd_ms"]), fmt(r["sdpa_fwdbwd_ms"]),
            fmt(r.get("adasplash2_fwdbwd_ms")), fmt(r["ours_vs_sdpa_fwd"]), fmt(r["ours_vs_sdpa_fwdbwd"]),
            fmt(r.get("ours_vs_adasplash2_fwdbwd")), fmt(r["ours_fwdbwd_TFLOPs"]),
            fmt(r["block_sparsity"], 2), peak]) + " |")
    lines += ["", "Decoding (q_len = 1, bf16, causal cache): ms and K+V bytes per ms.", "",
              "| B | H | D | cache | ours ms | SDPA ms | ours/SDPA | ours TB/s | SDPA TB/s |",
              "|---" * 9 + "|"]
    for r in report["decode"]:
        lines.append(f"| {r['B']} | {r['H']} | {r['D']} | {r['cache']} | {fmt(r['ours_ms'])} | "
                     f"{fmt(r['sdpa_ms'])} | {fmt(r['ours_vs_sdpa'])} | {fmt(r['ours_TBps'])} | "
                     f"{fmt(r['sdpa_TBps'])} |")
    lines += ["", "First fwd+bwd call (B=2, H=16, D=64, bf16): the very first call compiles the kernels; "
              "later new lengths reuse them:", "", "| N | when | first call s | second call s |",
              "|---|---|---|---|"]
    for r in report["first_call"]:
        lines.append(f"| {r['N']} | {r['note']} | {fmt(r['first_call_s'])} | {fmt(r['second_call_s'])} |")
    return "\n".join(lines) + "\n"


def heading(report, title):
    """A table's title line (with the GPU and versions), then the command that measured it."""
    info = report["info"]
    return [f"# {title} on {info['gpu']} (torch {info['torch']}, triton {info['triton']})", "",
            f"Command: `{info['command']}`", ""]


def error_lines(rows, describe):
    """'- <describe(row)> <key>: <message>' for each `*_error` entry of `rows`, after a blank line."""
    errors = [f"- {describe(r)} {key}: {val}" for r in rows for key, val in r.items()
              if key.endswith("_error")]
    return [""] + errors if errors else []


def times_against(row, key, base_key):
    """[fwd ms, fwd+bwd ms, each divided by base_key's in the same row] of case `key` (None where missing)."""
    times = [row.get(f"{key}_{step}_ms") for step in ("fwd", "fwdbwd")]
    bases = [row.get(f"{base_key}_{step}_ms") for step in ("fwd", "fwdbwd")]
    return times + [None if t is None or b is None else t / b for t, b in zip(times, bases, strict=True)]


def short_markdown(report):
    """The short-sequence table (--short) as markdown: one line per length, normaliser and path."""
    lines = heading(report, "Entmax attention at short rows") + [
             "bf16, causal, alpha = 1.5, NAPE heads (half ALiBi, half NoPE); asentmax: also q_scale. Fused "
             "kernels: the launchers as a training step calls them (forward with o2); single = the "
             "forward's single-tile path (register tile of KEYS keys), multi = its multi-pass path "
             "(single_tile=False), "
             "public = entmax_attention(backend='triton') with autograd (its default path, host work "
             "included). SDPA: softmax without ALiBi. Times in ms (median of do_bench); x SDPA = time / "
             "the default SDPA's.", "",
             "| B | H | D | N | KEYS | normaliser | path | fwd ms | fwd+bwd ms | x SDPA fwd | x SDPA f+b "
             "| passes |",
             "|---" * 12 + "|"]
    for r in report["short"]:
        shape = f"| {r['B']} | {r['H']} | {r['D']} | {r['N']} | {r['keys_in_registers']} |"
        entries = [(variant, path, f"{variant}_{path}") for variant in ("entmax", "asentmax")
                   for path in ("single", "multi", "public")]
        entries += [("softmax", name, name) for name, _ in sdpa_backends()]
        for normaliser, path, key in entries:
            cells = [normaliser, path, *map(fmt, times_against(r, key, "sdpa")), fmt(r.get(f"{key}_passes"))]
            lines.append(shape + " " + " | ".join(cells) + " |")
    return "\n".join(lines + error_lines(report["short"], lambda r: f"N={r['N']}")) + "\n"


def dtypes_markdown(report):
    """The input-dtype table (--dtypes) as markdown: one line per shape and (backend, dtype)."""
    lines = heading(report, "Entmax attention by input dtype") + [
             "Causal, alpha = 1.5, NAPE slopes; entmax_attention with autograd on the named backend. "
             "Times in ms (median of do_bench); x bf16 = time / triton bf16's at that shape; first call = "
             "wall seconds of the first fwd+bwd call of that (D, dtype) in this run (its kernels "
             "compiled, from an empty Triton cache only if the run started with one).", "",
             "| B | H | D | N | backend | dtype | fwd ms | fwd+bwd ms | x bf16 fwd | x bf16 f+b | "
             "fwd+bwd TFLOP/s | peak MB | first call s |",
             "|---" * 13 + "|"]
    for r in report["dtypes"]:
        shape = f"| {r['B']} | {r['H']} | {r['D']} | {r['N']} |"
        for backend, dtype in DTYPE_CASES:
            name = str(dtype).removeprefix("torch.")
            key = f"{backend}_{name}"
            cells = [backend, name, *map(fmt, times_against(r, key, "triton_bfloat16")),
                     fmt(r.get(f"{key}_fwdbwd_TFLOPs")), fmt(r.get(f"{key}_peak_mb")),
                     fmt(r.get(f"{key}_first_call_s"))]
            lines.append(shape + " " + " | ".join(cells) + " |")
    return "\n".join(lines + error_lines(report["dtypes"], lambda r: f"D={r['D']} N={r['N']}")) + "\n"


if __name__ == "__main__":
    main()
