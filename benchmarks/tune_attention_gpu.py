"""Tuning sweeps of the fused entmax attention kernels on the GPU: tile shapes and threshold-pass starts.

Two sweeps (bf16, causal, alpha = 1.5, B=2, H=16, with torch SDPA (flash) timed in the same run):

Shared tile shapes (the default): for each block configuration (BLOCK_M, BLOCK_N, num_warps, num_stages),
used by all three kernels, and each start of the threshold passes (attention_fwd.START_TOPK = K: from the K
largest per-tile row maxima; 0: from m - 1), the forward and forward+backward of entmax_attention, and the
threshold passes the query blocks took (mean and max over blocks). Inputs: random Gaussian q, k, v, and the
same with NAPE ALiBi slopes. The backward does not depend on the start, so forward+backward is timed with
the default start only.

    PYTHONPATH=src python benchmarks/tune_attention_gpu.py --out results/attention_tuning

Per kernel (--kernels HEAD_DIM): the tile shape of each kernel (forward, dq, dk/dv) on its own, from the
current attention_common.KERNEL_BLOCKS entry: each candidate of DEFAULT_CANDIDATES (or --fwd / --dq / --dkdv)
replaces one kernel's shape, the other two kept. On random inputs at --n keys it times the forward launcher
as a training step calls it (o2 written, no support) and the backward launcher on its outputs, and checks
every candidate's out, dq, dk, dv against the current configuration's (max abs difference relative to the
largest entry). The fastest forward, the dq candidate and the dk/dv candidate with the fastest backward
(among those within --max-rel-diff) make the winner; entmax_attention's forward and forward+backward are
then timed with the current entry and the winner, on random and NAPE inputs, beside SDPA, and the
winner's out, dq, dk, dv checked against the current entry's (NAPE: the tile skipping of every kernel on
the resampled tile tables). Candidates past --budget-s (less --final-s, kept for that final table) are
skipped and reported so. About 2-3.5 minutes on one H200 at D=128, 16K (24 kernel variants to compile,
1.5-2.5 s each on a CPU without a GPU):

    PYTHONPATH=src python benchmarks/tune_attention_gpu.py --kernels 128 --rep-ms 300 --budget-s 200 \
        --out results/attention_tuning4

writes <out>.json and <out>.md (rewritten after every row, so a run cut short keeps what it measured).
benchmarks/compile_kernels_sm90.py --candidates 128 compiles every candidate of DEFAULT_CANDIDATES on a
machine without a GPU first (registers, spills).
"""

import argparse
import json
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import asentmax.ops.triton.attention_fwd as attention_fwd
from asentmax.ops.attention import entmax_attention
from asentmax.ops.triton import attention_bwd, attention_common
from asentmax.ops.triton.attention import _MAX_NEWTON_PASSES, _TOL
from asentmax.ops.triton.attention_bwd import entmax_attention_bwd
from asentmax.ops.triton.attention_common import mode_of

KERNELS = ("fwd", "dq", "dkdv")  # the order of a KERNEL_BLOCKS entry
# head dim -> kernel -> tile shapes (BLOCK_M/BLOCK_N/num_warps/num_stages) tried in place of the current one.
# Each compiles for sm_90 within its shared memory and without spilling more than the current shape
# (compile_kernels_sm90.py --candidates 128). dk/dv's BLOCK_M is the query rows of one step, BLOCK_N the keys
# of a program.
DEFAULT_CANDIDATES = {  # most promising first (results/attention_gpu_notes.md, D = 128: the streamed bytes);
    # the current entry is the ninth session's winner (attention_tuning4.md); 64/32/4/2: the shape before
    128: dict(fwd=("128/32/8/3", "128/32/8/2", "64/32/4/2"),
              dq=("128/32/8/2", "64/32/4/3", "64/32/4/2"),
              dkdv=("32/128/8/1", "32/64/8/2", "64/32/8/2", "64/32/4/2")),
}


REP_MS = 100  # do_bench's timing window per measurement (--rep-ms)


def bench(fn, grad_to_none=None):
    return do_bench(fn, warmup=25, rep=REP_MS, grad_to_none=grad_to_none, return_mode="median")


def parse_block(text):
    """'64/32/4/2' -> (64, 32, 4, 2)."""
    blocks = tuple(int(x) for x in text.split("/"))
    if len(blocks) != 4:
        raise ValueError(f"tile shape {text!r} is not BLOCK_M/BLOCK_N/num_warps/num_stages")
    return blocks


def parse_blocks(text):
    return [parse_block(item) for item in text.split(",") if item]


def spelled(blocks):
    return "/".join(map(str, blocks))


def candidate_configs(current, candidates):
    """[(label, (fwd, dq, dkdv) tile shapes)]: the current entry first, then the candidates (spelled as
    parse_block reads them) of the kernels of KERNELS in turn, first the first of each kernel, then the
    second..., each with the other two kernels as current (a run cut short by its budget has measured
    every kernel's leading candidates)."""
    configs = [("current", tuple(current))]
    rounds = max((len(c) for c in candidates.values()), default=0)
    for j in range(rounds):
        for i, kernel in enumerate(KERNELS):
            if j < len(candidates[kernel]) and (blocks := parse_block(candidates[kernel][j])) != current[i]:
                configs.append((f"{kernel} {spelled(blocks)}", tuple(current[:i]) + (blocks,)
                                + tuple(current[i + 1:])))
    return configs


def inputs(n, dim, kind, batch=2, heads=16, device="cuda", dtype=torch.bfloat16):
    """q, k, v (batch, heads, n, dim) Gaussian, and NAPE's ALiBi slopes (1 / (h + 1) on the first half of the
    heads, 0 on the others) for kind 'nape', else None."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, dim, device=device, dtype=dtype, generator=gen) for _ in range(3))
    slopes = None
    if kind == "nape":
        slopes = torch.tensor([1.0 / (i + 1) if i < heads // 2 else 0.0 for i in range(heads)], device=device)
    return q, k, v, slopes


def time_pair(fn, q, k, v):
    """(forward ms, forward+backward ms) of fn()."""
    with torch.no_grad():
        fwd = bench(fn)
    for x in (q, k, v):
        x.requires_grad_(True)
    d_out = torch.randn_like(q)
    fwdbwd = bench(lambda: fn().backward(d_out), grad_to_none=(q, k, v))
    for x in (q, k, v):
        x.requires_grad_(False)
        x.grad = None
    return fwd, fwdbwd


def launcher_options(q, slopes):
    return dict(mode=mode_of(1.5), alpha=1.5, scale=q.shape[-1] ** -0.5, causal=True, q_scale=None, kpm=None,
                slopes=None if slopes is None else slopes.expand(q.shape[0], -1).contiguous())


def pass_counts(q, k, v, slopes, blocks):
    *_, passes = attention_fwd.entmax_attention_fwd(
        q, k, v, write_o2=False, tol=_TOL[q.dtype], max_iter=_MAX_NEWTON_PASSES, blocks=blocks,
        **launcher_options(q, slopes))
    return passes.float().mean().item(), passes.max().item()


def sdpa_pair(q, k, v):
    flash = partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        return time_pair(flash, q, k, v)


def run_shared(args, report, save):
    """The shared-tile-shape sweep (module docstring): rows into report['rows']."""
    rows = report["rows"]
    default_topk = attention_fwd.START_TOPK
    for dim, block_list in ((64, parse_blocks(args.blocks64)), (128, parse_blocks(args.blocks128))):
        saved = attention_common.KERNEL_BLOCKS[dim]
        for n in (int(x) for x in args.lengths.split(",")):
            if dim == 128 and n not in (int(x) for x in args.lengths128.split(",")):
                continue
            for kind in ("random", "nape"):
                q, k, v, slopes = inputs(n, dim, kind)
                sdpa = sdpa_pair(q, k, v)
                print(dict(D=dim, N=n, inputs=kind, sdpa_fwd=sdpa[0], sdpa_fwdbwd=sdpa[1]), flush=True)
                for blocks in block_list:
                    attention_common.KERNEL_BLOCKS[dim] = (blocks,) * 3
                    for topk in (int(x) for x in args.start_topk.split(",")):
                        attention_fwd.START_TOPK = topk
                        row = dict(D=dim, N=n, inputs=kind, blocks=spelled(blocks), start_topk=topk,
                                   sdpa_fwd_ms=sdpa[0], sdpa_fwdbwd_ms=sdpa[1])
                        ours = partial(entmax_attention, q, k, v, alpha=1.5, causal=True, alibi_slopes=slopes,
                                       backend="triton")
                        try:
                            with torch.no_grad():
                                row["ours_fwd_ms"] = bench(ours)
                            if topk == default_topk:
                                row["ours_fwdbwd_ms"] = time_pair(ours, q, k, v)[1]
                            row["passes_mean"], row["passes_max"] = pass_counts(q, k, v, slopes, blocks)
                        except Exception as exc:  # e.g. out of shared memory for a large tile
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                        print(row, flush=True)
                        rows.append(row)
                        save()
        attention_common.KERNEL_BLOCKS[dim] = saved
    attention_fwd.START_TOPK = default_topk


def rel_diff(x, ref):
    """max |x - ref| / max |ref| (fp32)."""
    return ((x.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


class _Skipped:
    """Stands in for a jit kernel: its launches do nothing (to time the launcher's other kernel alone)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def time_kernels(q, k, v, config, d_out):
    """(row, (out, dq, dk, dv)) of the forward and backward launchers with the (fwd, dq, dkdv) tile shapes
    `config`, as a training step calls them (o2 written, no support): first_call_s (compiles), fwd_ms,
    bwd_ms, passes; and their parts: pass_ms (one threshold pass: the forward less the forward without
    passes, max_iter = 0, over the mean passes), dq_ms (the backward with its dk/dv launch skipped) and
    dkdv_ms (the rest)."""
    fwd_blocks, *backward_blocks = config
    options = launcher_options(q, None)

    def forward(max_iter=_MAX_NEWTON_PASSES):
        return attention_fwd.entmax_attention_fwd(q, k, v, write_o2=True, write_support=False,
                                                  tol=_TOL[q.dtype], max_iter=max_iter, blocks=fwd_blocks,
                                                  **options)

    start = time.perf_counter()
    out, o2, tau, inv_z, _, tile_max, passes = forward()

    def backward():
        return entmax_attention_bwd(d_out, q, k, v, o2, tau, inv_z, tile_max, blocks=fwd_blocks,
                                    backward_blocks=backward_blocks, **options)

    grads = backward()[:3]
    torch.cuda.synchronize()
    row = dict(first_call_s=time.perf_counter() - start, fwd_ms=bench(forward), bwd_ms=bench(backward),
               passes_mean=passes.float().mean().item(), passes_max=passes.max().item())
    row["pass_ms"] = (row["fwd_ms"] - bench(partial(forward, 0))) / max(row["passes_mean"], 1e-9)
    dkdv_kernel = attention_bwd._entmax_attention_bwd_dkdv
    attention_bwd._entmax_attention_bwd_dkdv = _Skipped()
    try:
        row["dq_ms"] = bench(backward)
    finally:
        attention_bwd._entmax_attention_bwd_dkdv = dkdv_kernel
    row["dkdv_ms"] = row["bwd_ms"] - row["dq_ms"]
    return row, (out, *grads)


def op_row(q, k, v, slopes, config, dim, label, kind, sdpa):
    """(row, (out, dq, dk, dv)) of entmax_attention (the triton backend, the custom ops) with
    KERNEL_BLOCKS[dim] = config, timed beside SDPA; the results for one fixed output gradient."""
    attention_common.KERNEL_BLOCKS[dim] = config
    ours = partial(entmax_attention, q, k, v, alpha=1.5, causal=True, alibi_slopes=slopes, backend="triton")
    fwd, fwdbwd = time_pair(ours, q, k, v)
    row = dict(config=label, blocks=[spelled(b) for b in config], inputs=kind, ours_fwd_ms=fwd,
               ours_fwdbwd_ms=fwdbwd, sdpa_fwd_ms=sdpa[0], sdpa_fwdbwd_ms=sdpa[1], fwd_ratio=fwd / sdpa[0],
               fwdbwd_ratio=fwdbwd / sdpa[1])
    row["passes_mean"], row["passes_max"] = pass_counts(q, k, v, slopes, config[0])
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = entmax_attention(*leaves, alpha=1.5, causal=True, alibi_slopes=slopes, backend="triton")
    d_out = torch.randn(q.shape, generator=torch.Generator(device=q.device).manual_seed(1), device=q.device,
                        dtype=q.dtype)
    return row, (out.detach(), *torch.autograd.grad(out, leaves, d_out))


def winner(current, rows, max_rel_diff):
    """(fwd, dq, dkdv) of the fastest candidates per kernel among the rows within max_rel_diff (the forward
    by fwd_ms, dq and dk/dv by bwd_ms), each kernel's current shape where none beats it."""
    best = list(current)
    base = next(r for r in rows if r["config"] == "current")
    for i, (kernel, key) in enumerate(zip(KERNELS, ("fwd_ms", "bwd_ms", "bwd_ms"), strict=True)):
        fastest = base[key]
        for r in rows:
            if r.get("kernel") == kernel and "error" not in r and r["max_rel_diff"] <= max_rel_diff \
                    and r[key] < fastest:
                fastest, best[i] = r[key], parse_block(r["blocks"][i])
    return tuple(best)


def run_kernels(args, report, save):
    """The per-kernel sweep (module docstring): rows into report['kernel_rows'] and report['op_rows']."""
    dim, n = args.kernels, args.n
    start = time.perf_counter()
    current = attention_common.KERNEL_BLOCKS[dim]
    candidates = dict(DEFAULT_CANDIDATES.get(dim, {k: () for k in KERNELS}))
    for kernel in KERNELS:
        if getattr(args, kernel) is not None:
            candidates[kernel] = [x for x in getattr(args, kernel).split(",") if x]
    report.update(kernel_rows=[], op_rows=[], current=[spelled(b) for b in current], D=dim, N=n)
    q, k, v, _ = inputs(n, dim, "random")
    d_out = torch.randn_like(q)
    reference = None
    for label, config in candidate_configs(current, candidates):
        kernel = label.split()[0] if label != "current" else None
        row = dict(config=label, kernel=kernel, blocks=[spelled(b) for b in config])
        if reference is not None and time.perf_counter() - start > args.budget_s - args.final_s:
            row["error"] = "skipped: time budget"
        else:
            try:
                timing, results = time_kernels(q, k, v, config, d_out)
                row.update(timing)
                if reference is None:
                    reference = results
                names = ("out", "dq", "dk", "dv")
                row.update({f"diff_{name}": (x.float() - ref.float()).abs().max().item()
                            for name, x, ref in zip(names, results, reference, strict=True)})
                row["max_rel_diff"] = max(rel_diff(x, ref) for x, ref in zip(results, reference, strict=True))
            except Exception as exc:  # e.g. out of shared memory for a large tile
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                if reference is None:
                    raise
        row["elapsed_s"] = time.perf_counter() - start
        print(row, flush=True)
        report["kernel_rows"].append(row)
        save()
    best = winner(current, report["kernel_rows"], args.max_rel_diff)
    report["winner"] = [spelled(b) for b in best]
    for kind in ("random", "nape"):
        q, k, v, slopes = inputs(n, dim, kind)
        sdpa = sdpa_pair(q, k, v)
        for label, config in (("current", current), ("winner", best))[:1 if best == current else 2]:
            row, results = op_row(q, k, v, slopes, config, dim, label, kind, sdpa)
            if label == "current":
                reference = results
            row["max_rel_diff"] = max(rel_diff(x, ref) for x, ref in zip(results, reference, strict=True))
            row["elapsed_s"] = time.perf_counter() - start
            print(row, flush=True)
            report["op_rows"].append(row)
            save()
    attention_common.KERNEL_BLOCKS[dim] = current


def markdown_shared(report):
    lines = ["bf16, causal, alpha = 1.5, B=2, H=16. ms (median). blocks = BLOCK_M/BLOCK_N/warps/stages (all "
             "three kernels); start = START_TOPK (0: first pass from m - 1). "
             "passes = threshold passes per query block (mean, max).", "",
             "| D | N | inputs | blocks | start | ours fwd | SDPA fwd | fwd ratio | ours f+b | SDPA f+b "
             "| f+b ratio | passes mean/max |", "|---" * 12 + "|"]
    for r in report["rows"]:
        if "error" in r:
            lines.append(f"| {r['D']} | {r['N']} | {r['inputs']} | {r['blocks']} | {r['start_topk']} | "
                         f"error: {r['error'][:80]} |||||||")
            continue
        fb = r.get("ours_fwdbwd_ms")
        fb_ms = "-" if fb is None else f"{fb:.3g}"
        fb_ratio = "-" if fb is None else f"{fb / r['sdpa_fwdbwd_ms']:.2f}"
        lines.append(
            f"| {r['D']} | {r['N']} | {r['inputs']} | {r['blocks']} | {r['start_topk']} | "
            f"{r['ours_fwd_ms']:.3g} | {r['sdpa_fwd_ms']:.3g} | {r['ours_fwd_ms'] / r['sdpa_fwd_ms']:.2f} | "
            f"{fb_ms} | {r['sdpa_fwdbwd_ms']:.3g} | {fb_ratio} | {r['passes_mean']:.2f}/{r['passes_max']} |")
    return lines


def markdown_kernels(report):
    lines = [f"Per-kernel sweep at D = {report['D']}, N = {report['N']} (bf16, causal, alpha = 1.5, B=2, "
             "H=16). Tile shapes BLOCK_M/BLOCK_N/warps/stages of (forward, dq, dk/dv); current = "
             f"{' + '.join(report['current'])} (attention_common.KERNEL_BLOCKS). Each candidate replaces "
             "one kernel's shape. Launchers on random inputs: fwd = forward with o2 (as before a backward), "
             "bwd = both backward kernels (dq alone, dk/dv the rest); one pass = the forward less the "
             "forward without threshold passes, over the mean passes; diff = max abs difference to the "
             "current configuration's out, dq, dk, dv (rel: the largest over the largest entry); first call "
             "= compile + one forward and backward.", "",
             "| candidate | fwd ms | bwd ms | fwd+bwd ms | one pass ms | dq ms | dk/dv ms | passes mean/max "
             "| diff out/dq/dk/dv (rel) | first call s |", "|---" * 10 + "|"]
    for r in report["kernel_rows"]:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error'][:80]} |||||||||")
            continue
        lines.append(f"| {r['config']} | {r['fwd_ms']:.3g} | {r['bwd_ms']:.3g} | "
                     f"{r['fwd_ms'] + r['bwd_ms']:.3g} | {r['pass_ms']:.3g} | {r['dq_ms']:.3g} | "
                     f"{r['dkdv_ms']:.3g} | {r['passes_mean']:.2f}/{r['passes_max']} | "
                     f"{r['diff_out']:.1e}/{r['diff_dq']:.1e}/{r['diff_dk']:.1e}/{r['diff_dv']:.1e} "
                     f"({r['max_rel_diff']:.1e}) | "
                     f"{r['first_call_s']:.1f} |")
    if "winner" in report:
        entry = ", ".join("(" + ", ".join(b.split("/")) + ")" for b in report["winner"])
        lines += ["", f"Winner (fastest per kernel within the diff bound): {' + '.join(report['winner'])}; "
                  f"to apply it, src/asentmax/ops/triton/attention_common.py KERNEL_BLOCKS: "
                  f"`{report['D']}: ({entry}),`. entmax_attention (triton backend) with the current entry "
                  "and the winner, SDPA flash in the same run:", "",
                  "| config | inputs | ours fwd | SDPA fwd | fwd ratio | ours f+b | SDPA f+b | f+b ratio "
                  "| passes mean/max | rel diff to current |", "|---" * 10 + "|"]
        for r in report["op_rows"]:
            lines.append(f"| {r['config']} {' + '.join(r['blocks'])} | {r['inputs']} | "
                         f"{r['ours_fwd_ms']:.3g} | {r['sdpa_fwd_ms']:.3g} | {r['fwd_ratio']:.2f} | "
                         f"{r['ours_fwdbwd_ms']:.3g} | {r['sdpa_fwdbwd_ms']:.3g} | {r['fwdbwd_ratio']:.2f} | "
                         f"{r['passes_mean']:.2f}/{r['passes_max']} | {r['max_rel_diff']:.1e} |")
    return lines


def markdown(report):
    lines = [f"# Entmax attention tuning on {report['gpu']} "
             f"(torch {report['torch']}, triton {report['triton']})",
             "", f"Command: `{report['command']}`", ""]
    lines += markdown_kernels(report) if "kernel_rows" in report else markdown_shared(report)
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--lengths128", default="16384", help="lengths also run at head dim 128")
    parser.add_argument("--blocks64", default="64/64/4/2,64/64/4/3,128/64/8/2,128/64/8/3,128/128/8/2")
    parser.add_argument("--blocks128", default="64/64/8/2,128/64/8/2,64/32/4/2")
    parser.add_argument("--start-topk", default="0,16", help="START_TOPK values, comma separated")
    parser.add_argument("--kernels", type=int, metavar="HEAD_DIM",
                        help="the per-kernel sweep at this head dim")
    parser.add_argument("--n", type=int, default=16384, help="--kernels: sequence length")
    for kernel in KERNELS:
        parser.add_argument(f"--{kernel}", help=f"--kernels: {kernel} tile shapes instead of "
                            "DEFAULT_CANDIDATES (comma separated BLOCK_M/BLOCK_N/warps/stages)")
    parser.add_argument("--max-rel-diff", type=float, default=2e-2, help="--kernels: a winner's largest diff")
    parser.add_argument("--budget-s", type=float, default=230, help="--kernels: the whole run's seconds")
    parser.add_argument("--final-s", type=float, default=70,
                        help="--kernels: seconds kept for the final table")
    parser.add_argument("--rep-ms", type=float, default=REP_MS,
                        help="do_bench's timing window per measurement, ms (median of the calls in it)")
    parser.add_argument("--out", default="results/attention_tuning")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("tune_attention_gpu.py needs a CUDA GPU")
    global REP_MS
    REP_MS = args.rep_ms
    report = dict(command="python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__, triton=triton.__version__, rows=[])

    def save():
        with open(args.out + ".json", "w") as fh:
            json.dump(report, fh, indent=1)
        with open(args.out + ".md", "w") as fh:
            fh.write(markdown(report))

    (run_kernels if args.kernels else run_shared)(args, report, save)
    save()
    print(markdown(report))


if __name__ == "__main__":
    main()
