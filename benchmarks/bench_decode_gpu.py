"""GPU benchmark of entmax decoding (q_len <= 16 against a K/V cache) vs torch SDPA, side by side in one run.

Times (medians of triton.testing.do_bench, L2 flushed before each call) of
- ours: `entmax_attention(..., alpha, backend="triton")` under no_grad, the public call (argument checks
  included), which takes the split-over-keys kernels of asentmax/ops/triton/attention_decode.py;
- kernels: `entmax_attention_decode` called directly (the launcher alone, without the public call's checks);
- SDPA: torch.nn.functional.scaled_dot_product_attention (softmax; enable_gqa for grouped K/V heads).
Both sides run non-causally (for q_len = 1 causality changes nothing). bf16, B = 8, H = 16, D = 64 and 128,
caches of 1K, 4K, 16K and 64K keys with q_len = 1, plus q_len = 4 and GQA (Hkv = 4) at 16K. As a check of
the same code path on the GPU, each case also reports max |ours - SDPA| with alpha = 1 (softmax).

    PYTHONPATH=src python benchmarks/bench_decode_gpu.py --out results
writes results/decode_gpu.json and results/decode_gpu.md.
"""

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

# (B, H, Hkv, q_len, D, cache)
CASES = ([(8, 16, 16, 1, dim, cache) for dim in (64, 128) for cache in (1024, 4096, 16384, 65536)]
         + [(8, 16, 16, 4, 64, 16384), (8, 16, 4, 1, 64, 16384)])


def bench_case(b, h, hkv, nq, dim, cache, alpha):
    from triton.testing import do_bench

    from asentmax.ops.attention import entmax_attention
    from asentmax.ops.triton.attention_common import mode_of
    from asentmax.ops.triton.attention_decode import entmax_attention_decode

    q = torch.randn(b, h, nq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, cache, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = dim ** -0.5

    def ours():
        return entmax_attention(q, k, v, alpha=alpha, causal=False, backend="triton")

    def kernels():
        return entmax_attention_decode(q, k, v, mode=mode_of(alpha), alpha=alpha, scale=scale, causal=False,
                                       slopes=None, q_scale=None, kpm=None, tol=3e-2, max_iter=40)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != h)

    def timed(fn):
        return do_bench(fn, warmup=25, rep=200, return_mode="median")

    with torch.no_grad():
        softmax_err = (entmax_attention(q, k, v, alpha=1.0, causal=False, backend="triton").float()
                       - sdpa().float()).abs().max().item()
        row = dict(B=b, H=h, Hkv=hkv, q_len=nq, D=dim, cache=cache, alpha=alpha, ours_ms=timed(ours),
                   kernels_ms=timed(kernels), sdpa_ms=timed(sdpa), softmax_max_abs_diff=softmax_err)
    row["ours_vs_sdpa"] = row["ours_ms"] / row["sdpa_ms"]
    row["kernels_vs_sdpa"] = row["kernels_ms"] / row["sdpa_ms"]
    print({key: round(val, 4) if isinstance(val, float) else val for key, val in row.items()}, flush=True)
    return row


def markdown(report):
    info = report["info"]
    lines = [f"# Entmax decoding vs SDPA on {info['gpu']} "
             f"(torch {info['torch']}, triton {info['triton']})", "",
             f"Command: `{info['command']}`", "",
             f"bf16, non-causal, alpha = {info['alpha']} (ours) vs softmax SDPA. Median ms of do_bench (L2 "
             "flushed). ours = public entmax_attention call; kernels = the decode launcher alone. "
             "softmax |diff| = max |ours(alpha=1) - SDPA|.", "",
             "| B | H | Hkv | q_len | D | cache | ours ms | kernels ms | SDPA ms | ours/SDPA | kernels/SDPA "
             "| softmax abs diff |", "|---" * 12 + "|"]
    for r in report["rows"]:
        lines.append(f"| {r['B']} | {r['H']} | {r['Hkv']} | {r['q_len']} | {r['D']} | {r['cache']} | "
                     f"{r['ours_ms']:.4f} | {r['kernels_ms']:.4f} | {r['sdpa_ms']:.4f} | "
                     f"{r['ours_vs_sdpa']:.2f} | {r['kernels_vs_sdpa']:.2f} | "
                     f"{r['softmax_max_abs_diff']:.2g} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="directory for decode_gpu.json and decode_gpu.md")
    parser.add_argument("--alpha", type=float, default=1.5, help="entmax alpha of ours (1 = softmax)")
    args = parser.parse_args()
    if not (math.isfinite(args.alpha) and 1.0 <= args.alpha <= 2.0):
        parser.error("--alpha must be in [1, 2] (the decode kernels' range)")
    if not torch.cuda.is_available():
        sys.exit("bench_decode_gpu.py needs a CUDA device (none found); nothing was measured")
    import triton

    torch.manual_seed(0)
    info = dict(command="PYTHONPATH=src python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, alpha=args.alpha)
    report = dict(info=info, rows=[bench_case(*case, alpha=args.alpha) for case in CASES])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_gpu.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(args.out, "decode_gpu.md"), "w") as fh:
        fh.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
