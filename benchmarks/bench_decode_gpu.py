"""GPU benchmark of entmax decoding (q_len <= 16 against a K/V cache) vs torch SDPA, side by side in one run.

Times (medians of triton.testing.do_bench, L2 flushed before each call: host time included where the
host is slower than the GPU) of
- ours: `entmax_attention(..., alpha, backend="triton")` under no_grad, the public call (argument checks
  included);
- launcher: `entmax_attention_decode` called directly (without the public call's checks), which takes the
  one-launch kernel of asentmax/ops/triton/attention_decode_short.py for caches of <= SHORT_CACHE keys
  (multi-head or grouped, a program per query head) and the split-over-keys kernels of attention_decode.py
  with chunks of SPLIT_CHUNK keys for longer ones (path: short / split; takes_short_path); the GPU times
  below replay a captured CUDA graph, where the launcher follows its graph rule instead (graph path; the
  split path's chunks and threshold launch by attention_decode.split_chunk and output_solves);
- previous launcher: the ninth session's rule, on today's kernels: grouped caches of more than 65536 keys x
  head dim on the split path, whose chunks were the largest of 1024, 512, 256, 128 keys giving >= 256
  programs (previous_chunk);
- short, split: each of those two launchers forced, at caches of 1K-8K, so that the table shows where the
  threshold belongs; split 256: the split launcher with chunks of 256 keys; split no-solve: split with the
  thresholds always in their own launch (solve=False; the default solves them in the output kernel where a
  pack's scores fit 16384);
- per head, packed (GQA rows only): the launcher's path with one program per query head (pack=1, which
  reads each KV head once per query head of its group) and with one per pack of a KV head's query heads
  (attention_common.heads_per_program, which reads it once per pack; the split path's default);
- SDPA: torch.nn.functional.scaled_dot_product_attention (softmax; enable_gqa for grouped K/V heads);
and the GPU time alone (gpu_ms: calls replayed from a CUDA graph, each after an L2 flush, less the flushes;
no host time) of the launcher, each path forced (1K-8K) and SDPA: the columns that decide the path rule
without the host's noise (identical launches timed by do_bench differed by up to 1.6x in one run); and
the host time alone (host_us: a loop of calls timed before the GPU is waited for) of ours and the launcher.
Both sides run non-causally (for q_len = 1 causality changes nothing). bf16, B = 8, H = 16: D = 64 and 128
with caches of 1K, 2K and 4K keys at q_len 1 and 4, GQA (Hkv = 4, groups of 4) at 1K, 2K and 4K (q_len 1,
and q_len 4 at 4K) and groups of 8 (H = 32, Hkv = 4) at 4K; 8K (q_len 1), and as before 16K and 64K (q_len 1),
q_len 4 and GQA at 16K. Last, single-sequence GQA (B = 1, H = 32, Hkv = 8, D = 128 at 1K and 4K), where a
program per group gives only 8 programs. As a check of the same code path on the GPU, each case also
reports max |ours - SDPA| with alpha = 1 (softmax). About two to three minutes on an H200, most of it
compiling.

    PYTHONPATH=src python benchmarks/bench_decode_gpu.py --out results
writes results/decode_gpu.json and results/decode_gpu.md.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# (B, H, Hkv, q_len, D, cache)
CASES = ([(8, 16, 16, nq, dim, cache) for dim in (64, 128) for cache in (1024, 2048, 4096) for nq in (1, 4)]
         + [(8, 16, 4, 1, dim, cache) for dim in (64, 128) for cache in (1024, 2048, 4096)]
         + [(8, 16, 4, 4, 128, 4096), (8, 32, 4, 1, 128, 4096)]
         + [(1, 32, 8, 1, 128, cache) for cache in (1024, 4096)]
         + [(8, 16, 16, 1, dim, cache) for dim in (64, 128) for cache in (8192, 16384, 65536)]
         + [(8, 16, 16, 4, 64, 16384), (8, 16, 4, 1, 64, 16384)])
BOTH_PATHS_UP_TO = 8192  # caches at which the short and split launchers are both timed
FLUSH_BYTES = 256 * 2**20  # more than the H200's L2 (50 MB), as do_bench's flush


def previous_chunk(programs_per_chunk, n_k):
    """The ninth session's split chunk: the largest of 1024, 512, 256, 128 keys giving >= 256 programs."""
    for chunk in (1024, 512, 256, 128):
        if programs_per_chunk * -(-n_k // chunk) >= 256:
            return chunk
    return 128


def host_us(fn, calls=100, rounds=5):
    """Host microseconds of one fn() call: a loop of `calls` calls timed on the host before the GPU is
    waited for (the launches only queue; 100 calls stay below the launch queue's depth); the fastest of
    `rounds` loops."""
    fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
        torch.cuda.synchronize()
    return best / calls * 1e6


def gpu_ms(fn, calls=20, replays=15):
    """GPU milliseconds of one fn() without host time: `calls` of fn, each after an L2 flush, captured in a
    CUDA graph, less a graph of the flushes alone; the median over interleaved replays."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    side = torch.cuda.Stream()  # warm-up on a side stream before the capture, as torch.cuda.graphs asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def captured(body):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                flush.zero_()
                body()
        return graph

    with_fn, flushes_only = captured(fn), captured(lambda: None)
    diffs = []
    for _ in range(replays):
        times = []
        for graph in (with_fn, flushes_only):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        diffs.append((times[0] - times[1]) / calls)
    return statistics.median(diffs)


def bench_case(b, h, hkv, nq, dim, cache, alpha):
    from triton.testing import do_bench

    from asentmax.ops.attention import entmax_attention
    from asentmax.ops.triton.attention_common import heads_per_program, mode_of
    from asentmax.ops.triton.attention_decode import (
        entmax_attention_decode,
        entmax_attention_decode_split,
        takes_short_path,
    )
    from asentmax.ops.triton.attention_decode_short import entmax_attention_decode_short

    q = torch.randn(b, h, nq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, cache, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    options = dict(mode=mode_of(alpha), alpha=alpha, scale=dim ** -0.5, causal=False, slopes=None,
                   q_scale=None, kpm=None, tol=3e-2, max_iter=40)

    def ours():
        return entmax_attention(q, k, v, alpha=alpha, causal=False, backend="triton")

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != h)

    def timed(launcher):
        return do_bench(launcher, warmup=10, rep=60, return_mode="median")

    pack = heads_per_program(h // hkv, nq)

    def previous_launcher():
        previously_short = cache <= 2048 if pack == 1 else cache * dim <= 65536
        if previously_short:
            return entmax_attention_decode_short(q, k, v, **options)
        return entmax_attention_decode_split(q, k, v, chunk=previous_chunk(b * h // pack, cache), **options)

    def launcher():
        return entmax_attention_decode(q, k, v, **options)

    def short():
        return entmax_attention_decode_short(q, k, v, **options)

    def split():
        return entmax_attention_decode_split(q, k, v, **options)

    with torch.no_grad():
        softmax_err = (entmax_attention(q, k, v, alpha=1.0, causal=False, backend="triton").float()
                       - sdpa().float()).abs().max().item()
        row = dict(B=b, H=h, Hkv=hkv, q_len=nq, D=dim, cache=cache, alpha=alpha,
                   path="short" if takes_short_path(b, h, hkv, nq, cache, False) else "split",
                   graph_path="short" if takes_short_path(b, h, hkv, nq, cache, True) else "split",
                   ours_ms=timed(ours), launcher_ms=timed(launcher),
                   previous_launcher_ms=timed(previous_launcher), sdpa_ms=timed(sdpa),
                   launcher_gpu_ms=gpu_ms(launcher), sdpa_gpu_ms=gpu_ms(sdpa),
                   ours_host_us=host_us(ours), launcher_host_us=host_us(launcher),
                   softmax_max_abs_diff=softmax_err)
        if cache <= BOTH_PATHS_UP_TO:
            row["short_ms"] = timed(short)
            row["split_ms"] = timed(split)
            row["split256_ms"] = timed(lambda: entmax_attention_decode_split(q, k, v, chunk=256, **options))
            row["split_no_solve_ms"] = timed(lambda: entmax_attention_decode_split(q, k, v, solve=False,
                                                                                   **options))
            row["short_gpu_ms"] = gpu_ms(short)
            row["split_gpu_ms"] = gpu_ms(split)
        if hkv != h:
            path = entmax_attention_decode_short if row["path"] == "short" else entmax_attention_decode_split
            row["per_head_ms"] = timed(lambda: path(q, k, v, pack=1, **options))
            row["packed_ms"] = timed(lambda: path(q, k, v, pack=pack, **options))
    row["ours_vs_sdpa"] = row["ours_ms"] / row["sdpa_ms"]
    row["launcher_vs_sdpa"] = row["launcher_ms"] / row["sdpa_ms"]
    row["previous_vs_sdpa"] = row["previous_launcher_ms"] / row["sdpa_ms"]
    row["launcher_vs_sdpa_gpu"] = row["launcher_gpu_ms"] / row["sdpa_gpu_ms"]
    print({key: round(val, 4) if isinstance(val, float) else val for key, val in row.items()}, flush=True)
    return row


def markdown(report):
    info = report["info"]

    def ms(row, key):
        return f"{row[key]:.4f}" if key in row else "-"

    lines = [f"# Entmax decoding vs SDPA on {info['gpu']} "
             f"(torch {info['torch']}, triton {info['triton']})", "",
             f"Command: `{info['command']}` ({info['seconds']:.0f} s)", "",
             f"bf16, non-causal, alpha = {info['alpha']} (ours) vs softmax SDPA. Median ms of do_bench (L2 "
             "flushed; host time included where the host is slower than the GPU). ours = public "
             "entmax_attention call; launcher = entmax_attention_decode alone, which takes the one-launch "
             f"kernel (path short, a program per query head) for caches of up to {info['short_cache']} keys, "
             f"multi-head or grouped, the split kernels (chunks of {info['split_chunk']} keys) for longer "
             "ones (path), under CUDA-graph capture, as in every GPU ms column, its graph rule (graph path: "
             "grouped caches from 1,024 keys split, chunks of 256-1,024 keys giving 256 programs, a query "
             "head a program where packs would give fewer than 64); "
             "previous launcher = the ninth session's rule (grouped caches of more than 65536 keys x "
             "head dim split, chunks of 128-1024 keys giving >= 256 programs), on the same kernels; short / "
             "split = each launcher forced (split 256: chunks of 256 keys; no-solve: the thresholds in "
             "their own launch); per head / packed (GQA) = the launcher's path with one program per query "
             "head / per pack of the query heads sharing a KV head. GPU ms = the GPU time alone (CUDA graph "
             "replays after an L2 flush, less the flushes: no host time); host us = the host time of a call "
             "(a loop of calls timed before the GPU is waited for). softmax |diff| = "
             "max |ours(alpha=1) - SDPA|.", "",
             "| B | H | Hkv | q_len | D | cache | path | graph path | ours ms | launcher ms "
             "| previous launcher ms "
             "| short ms | split ms | split 256 ms | split no-solve ms | per head ms | packed ms | SDPA ms "
             "| launcher GPU ms | short GPU ms | split GPU ms | SDPA GPU ms | ours host us "
             "| launcher host us | ours/SDPA | launcher/SDPA | previous/SDPA | launcher/SDPA GPU "
             "| softmax abs diff |",
             "|---" * 28 + "|"]
    for r in report["rows"]:
        lines.append(f"| {r['B']} | {r['H']} | {r['Hkv']} | {r['q_len']} | {r['D']} | {r['cache']} | "
                     f"{r['path']} | {r.get('graph_path', '-')} | {r['ours_ms']:.4f} | "
                     f"{r['launcher_ms']:.4f} | "
                     f"{r['previous_launcher_ms']:.4f} | {ms(r, 'short_ms')} | {ms(r, 'split_ms')} | "
                     f"{ms(r, 'split256_ms')} | {ms(r, 'split_no_solve_ms')} | "
                     f"{ms(r, 'per_head_ms')} | {ms(r, 'packed_ms')} | {r['sdpa_ms']:.4f} | "
                     f"{r['launcher_gpu_ms']:.4f} | {ms(r, 'short_gpu_ms')} | {ms(r, 'split_gpu_ms')} | "
                     f"{r['sdpa_gpu_ms']:.4f} | {r['ours_host_us']:.1f} | {r['launcher_host_us']:.1f} | "
                     f"{r['ours_vs_sdpa']:.2f} | {r['launcher_vs_sdpa']:.2f} | "
                     f"{r['previous_vs_sdpa']:.2f} | {r['launcher_vs_sdpa_gpu']:.2f} | "
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

    from asentmax.ops.triton.attention_decode import SHORT_CACHE, SPLIT_CHUNK

    torch.manual_seed(0)
    started = time.perf_counter()
    info = dict(command="PYTHONPATH=src python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, alpha=args.alpha, short_cache=SHORT_CACHE,
                split_chunk=SPLIT_CHUNK)
    report = dict(info=info, rows=[bench_case(*case, alpha=args.alpha) for case in CASES])
    info["seconds"] = time.perf_counter() - started
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_gpu.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(args.out, "decode_gpu.md"), "w") as fh:
        fh.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
