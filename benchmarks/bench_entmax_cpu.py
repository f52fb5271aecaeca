"""CPU benchmark of asentmax.ops.entmax against torch.softmax and the `entmax` package, side by side.

For each shape and alpha, every method runs once per round, rounds interleaved (the machine is shared,
so load changes hit all methods alike); the median wall-clock over rounds is reported (the `entmax`
package's functions, 40-200x slower, get --slow-rounds rounds and no warm-up), forward only
and forward + backward, together with the ratio to torch.softmax on the same input in the same run.
Writes results/entmax_cpu.json and results/entmax_cpu.md.

    .venv/bin/python benchmarks/bench_entmax_cpu.py            # full run (a few minutes)
    .venv/bin/python benchmarks/bench_entmax_cpu.py --quick    # small shapes, for a smoke test
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from asentmax.ops.entmax import entmax

ALPHAS = (1.25, 1.5, 1.75, 2.0)


def package_methods(alpha, numel, backward):
    """The `entmax` package's functions for this alpha (name -> callable), if it is installed.

    entmax_bisect takes ~40 s per 4096 x 4096 forward here: it runs forward only up to 2^24 elements
    and forward + backward only up to 2^22."""
    try:
        import entmax as pkg
    except ImportError:
        return {}
    methods = {}
    if numel <= (1 << 22 if backward else 1 << 24):
        methods["entmax_bisect"] = lambda x: pkg.entmax_bisect(x, alpha, dim=-1)
    if alpha == 1.5:
        methods["entmax15"] = lambda x: pkg.entmax15(x, dim=-1)
    if alpha == 2.0:
        methods["sparsemax"] = lambda x: pkg.sparsemax(x, dim=-1)
    return methods


def timed(fn, x, backward, grad):
    if backward:
        xr = x.detach().requires_grad_(True)
        start = time.perf_counter()
        fn(xr).backward(grad)
    else:
        with torch.no_grad():
            start = time.perf_counter()
            fn(x)
    return time.perf_counter() - start


def bench_shape(shape, alphas, rounds, slow_rounds, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    grad = torch.randn(*shape, generator=g)
    records = []
    for backward in (False, True):
        mode = "fwd+bwd" if backward else "fwd"
        for alpha in alphas:
            methods = {"torch.softmax": lambda x: torch.softmax(x, -1),
                       "asentmax.entmax": lambda x, a=alpha: entmax(x, a)}
            package = package_methods(alpha, x.numel(), backward)
            methods.update({f"entmax.{k}": v for k, v in package.items()})
            times = {name: [] for name in methods}
            for name, fn in methods.items():  # warm-up (the package's slow functions need none)
                if not name.startswith("entmax."):
                    timed(fn, x, backward, grad)
            for r in range(rounds):
                for name, fn in methods.items():
                    if name.startswith("entmax.") and r >= slow_rounds:
                        continue
                    times[name].append(timed(fn, x, backward, grad))
            soft = statistics.median(times["torch.softmax"])
            for name, ts in times.items():
                med = statistics.median(ts)
                records.append({"shape": list(shape), "alpha": alpha, "mode": mode, "method": name,
                                "median_ms": round(med * 1e3, 3), "ratio_vs_softmax": round(med / soft, 2),
                                "rounds": len(ts)})
                print(f"{str(shape):>14} a={alpha:<5} {mode:8} {name:22} {med * 1e3:9.2f} ms "
                      f"{med / soft:7.2f}x softmax", flush=True)
    return records


def markdown(records, meta):
    lines = ["# alpha-entmax on CPU vs torch.softmax and the entmax package\n",
             f"Command: `{meta['command']}`\n",
             f"torch {meta['torch']}, {meta['threads']} threads, {meta['cpu']}, commit {meta['commit']}, "
             f"{meta['date']}. Median wall-clock over interleaved rounds; ratio = time / torch.softmax "
             f"time on the same input in the same run. Inputs: standard normal logits, fp32.\n",
             "| shape | alpha | mode | method | median ms | x softmax |", "|---|---|---|---|---|---|"]
    for r in records:
        if r["method"] == "torch.softmax" and r["alpha"] != records[0]["alpha"]:
            continue
        alpha = r["alpha"] if r["method"] != "torch.softmax" else "-"
        lines.append(f"| {r['shape'][0]}x{r['shape'][1]} | {alpha} | {r['mode']} "
                     f"| {r['method']} | {r['median_ms']:.1f} | {r['ratio_vs_softmax']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and few rounds (smoke test)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per method")
    parser.add_argument("--slow-rounds", type=int, default=1, help="rounds for the entmax package (slow)")
    parser.add_argument("--out", default="results/entmax_cpu", help="output path without extension")
    args = parser.parse_args()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    shapes = [(256, 512), (64, 4096)] if args.quick else [(4096, 4096), (1024, 32768), (16384, 256)]
    records = []
    for shape in shapes:
        records += bench_shape(shape, ALPHAS, args.rounds, min(args.slow_rounds, args.rounds), seed=0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    meta = {"command": " ".join([".venv/bin/python"] + sys.argv), "torch": torch.__version__,
            "threads": threads, "cpu": platform.processor() or platform.machine(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": args.rounds}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "records": records}, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(records, meta))
    print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
