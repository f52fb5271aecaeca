"""Tuning sweep of the fused entmax attention kernels on the GPU: tile shapes and threshold-pass variants.

For each block configuration (BLOCK_M, BLOCK_N, num_warps, num_stages) and each start of the threshold
passes (attention_fwd.START_TOPK = K: from the K largest per-tile row maxima; 0: from m - 1), times
the forward and forward+backward (bf16, causal, alpha = 1.5, B=2, H=16) next to torch SDPA (flash) in the same
run, and reports the threshold passes the query blocks took (mean and max over blocks). Inputs: random
Gaussian q, k, v, and the same with NAPE ALiBi slopes. The backward does not depend on the start,
so forward+backward is timed with the default start only.

    PYTHONPATH=src python benchmarks/tune_attention_gpu.py --out results/attention_tuning
writes results/attention_tuning.json and .md.
"""

import argparse
import json
import sys
from functools import partial

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

import asentmax.ops.triton.attention as triton_attention
import asentmax.ops.triton.attention_fwd as attention_fwd
from asentmax.ops.attention import entmax_attention
from asentmax.ops.triton.attention_common import mode_of


def bench(fn, grad_to_none=None):
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def parse_blocks(text):
    return [tuple(int(x) for x in item.split("/")) for item in text.split(",")]


def inputs(n, dim, kind):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 16, n, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))
    slopes = None
    if kind == "nape":
        slopes = torch.tensor([1.0 / (i + 1) if i < 8 else 0.0 for i in range(16)], device="cuda")
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


def pass_counts(q, k, v, slopes, blocks):
    *_, passes = attention_fwd.entmax_attention_fwd(
        q, k, v, mode=mode_of(1.5), alpha=1.5, scale=q.shape[-1] ** -0.5, causal=True,
        slopes=None if slopes is None else slopes.expand(q.shape[0], -1).contiguous(), q_scale=None, kpm=None,
        write_o2=False, tol=triton_attention._TOL[q.dtype], max_iter=triton_attention._MAX_NEWTON_PASSES,
        blocks=blocks)
    return passes.float().mean().item(), passes.max().item()


def run(args):
    rows = []
    default_topk = attention_fwd.START_TOPK
    for dim, block_list in ((64, parse_blocks(args.blocks64)), (128, parse_blocks(args.blocks128))):
        for n in (int(x) for x in args.lengths.split(",")):
            if dim == 128 and n not in (int(x) for x in args.lengths128.split(",")):
                continue
            for kind in ("random", "nape"):
                q, k, v, slopes = inputs(n, dim, kind)
                flash = partial(F.scaled_dot_product_attention, q, k, v, is_causal=True)
                with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                    sdpa = time_pair(flash, q, k, v)
                print(dict(D=dim, N=n, inputs=kind, sdpa_fwd=sdpa[0], sdpa_fwdbwd=sdpa[1]), flush=True)
                for blocks in block_list:
                    triton_attention.block_config = lambda head_dim, n_q, blocks=blocks: blocks
                    for topk in (int(x) for x in args.start_topk.split(",")):
                        attention_fwd.START_TOPK = topk
                        row = dict(D=dim, N=n, inputs=kind, blocks="/".join(map(str, blocks)),
                                   start_topk=topk, sdpa_fwd_ms=sdpa[0],
                                   sdpa_fwdbwd_ms=sdpa[1])
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
    attention_fwd.START_TOPK = default_topk
    return rows


def markdown(report):
    lines = [f"# Entmax attention tuning on {report['gpu']} "
             f"(torch {report['torch']}, triton {report['triton']})",
             "", f"Command: `{report['command']}`", "",
             "bf16, causal, alpha = 1.5, B=2, H=16. ms (median). blocks = BLOCK_M/BLOCK_N/warps/stages; "
             "start = START_TOPK (0: first pass from m - 1). "
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
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="4096,16384")
    parser.add_argument("--lengths128", default="16384", help="lengths also run at head dim 128")
    parser.add_argument("--blocks64", default="64/64/4/2,64/64/4/3,128/64/8/2,128/64/8/3,128/128/8/2")
    parser.add_argument("--blocks128", default="64/64/8/2,128/64/8/2,64/32/4/2")
    parser.add_argument("--start-topk", default="0,16", help="START_TOPK values, comma separated")
    parser.add_argument("--out", default="results/attention_tuning")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tune_attention_gpu.py needs a CUDA GPU")
    report = dict(command="python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                  torch=torch.__version__, triton=triton.__version__, rows=run(args))
    with open(args.out + ".json", "w") as fh:
        json.dump(report, fh, indent=1)
    with open(args.out + ".md", "w") as fh:
        fh.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
