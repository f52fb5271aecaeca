"""GPU benchmark of the row-wise Triton alpha-entmax (docs/method.md section 2) against its peers.

Side by side in one run, fp32, forward and forward+backward, triton.testing.do_bench medians (L2 flushed
between repeats): torch.softmax (the speed target: at most 1.5x its time), asentmax's `entmax_rows`,
the `entmax` package (entmax15 sort-based and entmax_bisect) and adasplash's row `triton_entmax`, where
installed. Also the copy time of the same tensor (the bytes floor: one read + one write), the error of each
method against an fp64 sort-based oracle on sampled rows, and a small sweep of our launch configurations.

    PYTHONPATH=src python benchmarks/bench_entmax_gpu.py --out results [--with-adasplash] [--quick]
writes entmax_gpu.json and entmax_gpu.md into --out (results/entmax_gpu.md says which version produced
the committed numbers). Needs a CUDA GPU; about 1-2 minutes on an H200 (adasplash autotunes: slower).
"""

import argparse
import json
import os
import platform
import subprocess
import time

import torch
import triton
from triton.testing import do_bench

from asentmax.ops.triton import entmax_rows as er

SHAPES = [(8192, 1024), (1024, 32768), (65536, 128), (128, 100_000)]
TARGET_SHAPES = [(8192, 1024), (1024, 32768)]


def oracle15(x):
    """fp64 sort-based entmax-1.5 over the last dim (Peters et al. 2019)."""
    s = x.double() / 2
    srt = torch.sort(s, dim=-1, descending=True).values
    k = torch.arange(1, s.shape[-1] + 1, device=x.device, dtype=torch.float64)
    mean = srt.cumsum(-1) / k
    mean_sq = (srt * srt).cumsum(-1) / k
    taus = mean - torch.sqrt(torch.clamp((1 - k * (mean_sq - mean * mean)) / k, min=0))
    size = (taus <= srt).sum(-1, keepdim=True)
    tau = taus.gather(-1, size - 1)
    return torch.clamp(s - tau, min=0) ** 2


def peers(alpha, with_adasplash):
    """name -> function(x) for every method available here (alpha applies to the entmax ones)."""
    out = {"softmax": lambda x: torch.softmax(x, -1), "ours": lambda x: er.entmax_rows(x, alpha)}
    if with_adasplash:  # autotunes 15 configs per new length in its backward: costly, so opt-in
        try:
            from adasplash.triton_entmax_v2 import triton_entmax

            out["adasplash.triton_entmax"] = lambda x: triton_entmax(x, alpha=alpha)
        except ImportError:
            pass
        return out
    try:
        import entmax

        if alpha == 1.5:
            out["entmax.entmax15"] = lambda x: entmax.entmax15(x, dim=-1)
        out["entmax.entmax_bisect"] = lambda x: entmax.entmax_bisect(x, alpha=alpha, dim=-1)
    except ImportError:
        pass
    return out


def time_ms(fn, *, backward, x, g):
    """Eager median: includes the Python/launch time on the host when that exceeds the GPU time."""
    if backward:
        xg = x.clone().requires_grad_(True)
        return do_bench(lambda: fn(xg).backward(g), grad_to_none=[xg], return_mode="median")
    return do_bench(lambda: fn(x), return_mode="median")


def graph_ms(step):
    """Median of CUDA-graph replays of step() (GPU time without host overhead); None if not capturable."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return do_bench(graph.replay, return_mode="median")
    except Exception as err:  # some peers synchronise or allocate on the host inside
        print(f"  (no CUDA graph: {type(err).__name__}: {str(err)[:80]})", flush=True)
        torch.cuda.synchronize()
        return None


def warm_up_gpu(seconds=1.0):
    """Run matrix products until the clocks have ramped up (the first timings of a run were slow)."""
    a = torch.randn(4096, 4096, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        a @ a
        torch.cuda.synchronize()


def accuracy(fn, x, rows):
    with torch.no_grad():
        p = fn(x)
    sums = (p.double().sum(-1) - 1).abs().max().item()
    err = (p[rows].double() - oracle15(x[rows])).abs().max().item()
    return sums, err


def run_peers(shapes, alpha, skip_slow_above, with_adasplash=False):
    records = []
    for rows, n in shapes:
        gen = torch.Generator(device="cuda").manual_seed(rows + n)
        x = torch.randn(rows, n, device="cuda", generator=gen)
        g = torch.randn(rows, n, device="cuda", generator=gen)
        sample = torch.arange(0, rows, max(1, rows // 64), device="cuda")
        copy_ms = do_bench(lambda: x.clone(), return_mode="median")  # noqa: B023
        for name, fn in peers(alpha, with_adasplash).items():
            if name.startswith("entmax.") and (rows * n > skip_slow_above or alpha != 1.5):  # device time
                continue
            rec = {"shape": [rows, n], "alpha": alpha, "method": name, "copy_ms": copy_ms}
            t0 = time.time()
            rec["fwd_ms"] = time_ms(fn, backward=False, x=x, g=g)
            rec["fwd_bwd_ms"] = time_ms(fn, backward=True, x=x, g=g)
            xg = x.clone().requires_grad_(True)
            rec["fwd_graph_ms"] = graph_ms(lambda: fn(x))  # noqa: B023
            rec["fwd_bwd_graph_ms"] = graph_ms(lambda: torch.autograd.grad(fn(xg), xg, g))  # noqa: B023
            rec["wall_s"] = round(time.time() - t0, 2)
            if alpha == 1.5 and name != "softmax":
                rec["max_abs_sum_err"], rec["max_abs_err_vs_fp64"] = accuracy(fn, x, sample)
            records.append(rec)
            print(f"{rows}x{n} a={alpha} {name:24s} fwd {rec['fwd_ms']:.4f} "
                  f"graph {_fmt(rec['fwd_graph_ms'])} | fwd+bwd {rec['fwd_bwd_ms']:.4f} "
                  f"graph {_fmt(rec['fwd_bwd_graph_ms'])}", flush=True)
    return records


def _fmt(value, digits=4):
    return "n/a" if value is None else f"{value:.{digits}f}"


SWEEP = {  # shape -> (num_warps, elems_per_program, fused reductions)
    (8192, 1024): [(2, 1024, True), (2, 1024, False), (1, 1024, True), (4, 1024, True), (2, 2048, True),
                   (4, 2048, True)],
    (1024, 32768): [(32, 32768, True), (32, 32768, False), (16, 32768, True)],
    (65536, 128): [(1, 512, True), (2, 1024, True), (4, 2048, True), (1, 256, True), (2, 1024, False)],
}


def run_sweep(quick=False):
    """Our launch configurations on a few shapes, alpha=1.5, CUDA-graph medians of the direct launches."""
    records = []
    for (rows, n), configs in SWEEP.items():
        if quick and (rows, n) not in TARGET_SHAPES:
            continue
        x = torch.randn(rows, n, device="cuda")
        g = torch.randn(rows, n, device="cuda")
        p, _ = er._forward(x, 1.5)
        for warps, elems, fused in configs:
            cfg = {"num_warps": warps, "elems_per_program": elems, "fused": fused}
            fwd = graph_ms(lambda: er._forward(x, 1.5, **cfg))  # noqa: B023
            bwd = graph_ms(lambda: er._backward(p, g, 1.5, **cfg))  # noqa: B023
            records.append({"shape": [rows, n], **cfg, "fwd_ms": fwd, "bwd_ms": bwd})
            print(f"sweep {rows}x{n} {cfg}: fwd {_fmt(fwd)} bwd {_fmt(bwd)}", flush=True)
        if n > 4096:  # the chunk-looping kernel on the same shape, for comparison
            fwd = graph_ms(lambda: er._forward(x, 1.5, max_block_n=4096))  # noqa: B023
            bwd = graph_ms(lambda: er._backward(p, g, 1.5, max_block_n=4096))  # noqa: B023
            records.append({"shape": [rows, n], "kernel": "chunked(4096)", "fwd_ms": fwd, "bwd_ms": bwd})
            print(f"sweep {rows}x{n} chunked: fwd {_fmt(fwd)} bwd {_fmt(bwd)}", flush=True)
    return records


def markdown(meta, records, sweep):
    lines = ["# Row-wise alpha-entmax on the GPU (fp32)", "",
             f"`{meta['command']}` on {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, "
             f"commit {meta['commit']}. Medians of triton.testing.do_bench in ms "
             "(L2 flushed between repeats). "
             "'eager' times the Python call (host overhead included when it exceeds the GPU time); "
             "'graph' times CUDA-graph replays of the same call (GPU time). "
             "'x sm' = time over torch.softmax's time in the same run and mode; fwd+bwd = forward, then "
             "autograd backward with a random upstream gradient.", "",
             "| shape | alpha | method | fwd eager | x sm | fwd graph | x sm | fwd+bwd eager | x sm "
             "| fwd+bwd graph | x sm | max abs err vs fp64 | max abs(sum-1) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    soft = {(tuple(r["shape"]), r["alpha"]): r for r in records if r["method"] == "softmax"}

    def ratio(r, s, key):
        return "" if r.get(key) is None or s.get(key) is None else f"{r[key] / s[key]:.2f}"

    for r in records:
        s = soft[(tuple(r["shape"]), r["alpha"])]
        err = f"{r['max_abs_err_vs_fp64']:.1e}" if "max_abs_err_vs_fp64" in r else ""
        sums = f"{r['max_abs_sum_err']:.1e}" if "max_abs_sum_err" in r else ""
        cells = []
        for key in ("fwd_ms", "fwd_graph_ms", "fwd_bwd_ms", "fwd_bwd_graph_ms"):
            cells += [_fmt(r.get(key)), ratio(r, s, key)]
        lines.append(f"| {r['shape'][0]}x{r['shape'][1]} | {r['alpha']} | {r['method']} | "
                     + " | ".join(cells) + f" | {err} | {sums} |")
    copies = sorted({(tuple(r["shape"]), round(r["copy_ms"], 4))
                     for r in records if r["method"] == "softmax"})
    lines += ["", "x.clone() (one read + one write, the bytes floor of a forward), eager ms: "
              + ", ".join(f"{a}x{b}: {c:.4f}" for (a, b), c in copies)]
    lines += ["", "## Launch sweep (ours, alpha=1.5, CUDA-graph medians of the direct launches)", "",
              "| shape | config | fwd ms | bwd ms |", "|---|---|---|---|"]
    for r in sweep:
        cfg = r.get("kernel") or (f"num_warps={r['num_warps']}, elems/program={r['elems_per_program']}, "
                                  f"fused reductions={r['fused']}")
        lines.append(f"| {r['shape'][0]}x{r['shape'][1]} | {cfg} | {_fmt(r['fwd_ms'])} "
                     f"| {_fmt(r['bwd_ms'])} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="folder for entmax_gpu.json and entmax_gpu.md")
    parser.add_argument("--commit", default=None, help="git commit to record (default: git rev-parse HEAD)")
    parser.add_argument("--skip-slow-above", type=int, default=2**25,
                        help="skip the entmax package on tensors with more elements than this")
    parser.add_argument("--with-adasplash", action="store_true",
                        help="also time adasplash's row entmax on the target shapes (it autotunes)")
    parser.add_argument("--quick", action="store_true",
                        help="only the two target shapes at alpha=1.5 and their launch sweep")
    args = parser.parse_args()
    commit = args.commit
    if commit is None:
        try:
            git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
            commit = git.stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    flags = (" --with-adasplash" if args.with_adasplash else "") + (" --quick" if args.quick else "")
    meta = {"command": "PYTHONPATH=src python benchmarks/bench_entmax_gpu.py" + flags,
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "commit": commit, "dtype": "float32"}
    os.makedirs(args.out, exist_ok=True)
    records, sweep = [], []

    def save():  # after every phase, so that a run cut short still leaves its numbers
        with open(os.path.join(args.out, "entmax_gpu.json"), "w") as f:
            json.dump({"meta": meta, "records": records, "sweep": sweep}, f, indent=1)
        with open(os.path.join(args.out, "entmax_gpu.md"), "w") as f:
            f.write(markdown(meta, records, sweep))

    warm_up_gpu()
    records += run_peers(TARGET_SHAPES if args.quick else SHAPES, 1.5, args.skip_slow_above)
    save()
    if not args.quick:
        records += run_peers(TARGET_SHAPES, 2.0, args.skip_slow_above)
        records += run_peers(TARGET_SHAPES, 1.25, args.skip_slow_above)
        save()
    sweep += run_sweep(quick=args.quick)
    save()
    if args.with_adasplash:
        records += [r for r in run_peers(TARGET_SHAPES, 1.5, 0, with_adasplash=True) if r["method"] != "ours"]
        save()
    print(markdown(meta, records, sweep))


if __name__ == "__main__":
    main()
