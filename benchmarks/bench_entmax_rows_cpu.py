"""CPU time of asentmax.ops.entmax on attention-like rows: this working tree and a git revision, side by side.

Attention mixes heads whose rows are near-uniform (most entries inside the entmax support) with heads whose
rows are peaked (a few entries), in one call. Inputs here: (rows, n) fp32 logits, standard normal times 10,
with every third row scaled by 0.01 (near-uniform, standard deviation 0.1: `mixed`; in the support at alpha
1.5 40-49 % of a row of 1,020 entries and 17-21 % of 4,096, at alpha 1.25 all), or each row scaled by its own
10^u, u uniform in [-2, 1], so that the rows' candidate counts spread from a few to all (`spread`, as a
trained model's heads do: results/entmax_classes_cpu.md), or every row scaled by 0.02 (`moderate`: standard
deviation 0.2; at alpha 1.5 14-23 % of a row of 1,020 entries in the support and 6-9 % of 4,096, at alpha 1.25
96-100 %: results/entmax_pass_shrink_cpu.md); the same seed for both sides. Each side runs in its own child
process (the revision from a temporary `git worktree`), a few calls to warm up, then `--calls` timed calls
(forward, and forward + backward against a fixed random gradient), median; the two sides alternate for
`--rounds` rounds and the table gives the median of each side's medians and their ratio. Writes OUT.json and
OUT.md.

    .venv/bin/python benchmarks/bench_entmax_rows_cpu.py --base REV --out results/entmax_rows_cpu
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ((16320, 1020), (4096, 4096))
INPUTS = ("mixed", "spread", "moderate")
ALPHAS = (1.5, 1.25)
MODES = ("fwd", "fwd+bwd")

CHILD = """
import statistics, sys, time, torch
from asentmax.ops.entmax import entmax
rows, n, alpha, calls = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(int(sys.argv[5]))
backward = sys.argv[6] == "fwd+bwd"
g = torch.Generator().manual_seed(0)
x = 10 * torch.randn(rows, n, generator=g)
if sys.argv[7] == "mixed":
    x[::3] *= 0.01
elif sys.argv[7] == "moderate":
    x *= 0.02
else:
    x *= 10.0 ** (3 * torch.rand(rows, 1, generator=g) - 3)
grad = torch.randn(rows, n, generator=g)

def call():
    if backward:
        entmax(x.detach().requires_grad_(True), alpha).backward(grad)
    else:
        with torch.no_grad():
            entmax(x, alpha)

call()
times = []
for _ in range(calls):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def child_median(src: Path, shape, alpha, mode, calls, threads, inputs) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(shape[0]), str(shape[1]), str(alpha), str(calls),
                          str(threads), mode, inputs], env=env, capture_output=True, text=True, check=True,
                         timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per round")
    parser.add_argument("--out", default="results/entmax_rows_cpu", help="output path without extension")
    parser.add_argument("--inputs", nargs="+", choices=INPUTS, default=list(INPUTS), help="input kinds")
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    git = ["git", "-C", str(ROOT)]
    base = subprocess.run([*git, "rev-parse", "--short", args.base], capture_output=True, text=True,
                          check=True).stdout.strip()
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        worktree = Path(tmp) / "base"
        subprocess.run([*git, "worktree", "add", "--detach", str(worktree), base], check=True,
                       capture_output=True)
        try:
            cases = [(i, m, s, a) for i in args.inputs for m in MODES for s in SHAPES for a in ALPHAS]
            for inputs, mode, shape, alpha in cases:
                sides = {"base": [], "this tree": []}
                for _ in range(args.rounds):
                    for side, src in (("base", worktree / "src"), ("this tree", ROOT / "src")):
                        sides[side].append(child_median(src, shape, alpha, mode, args.calls, threads,
                                                        inputs))
                base_ms, new_ms = (1e3 * statistics.median(sides[k]) for k in ("base", "this tree"))
                records.append({"inputs": inputs, "mode": mode, "shape": list(shape), "alpha": alpha,
                                "base_ms": round(base_ms, 1), "this_tree_ms": round(new_ms, 1),
                                "speedup": round(base_ms / new_ms, 2)})
                print(f"{inputs} {mode} {shape} alpha {alpha}: base {base_ms:.1f} ms, this tree "
                      f"{new_ms:.1f} ms ({base_ms / new_ms:.2f}x)", flush=True)
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(worktree)], check=False,
                           capture_output=True)
    meta = {"command": " ".join([".venv/bin/python", "benchmarks/bench_entmax_rows_cpu.py", *sys.argv[1:]]),
            "base": base, "this_tree": f"{head} + working tree", "threads": threads,
            "cpu": platform.processor() or platform.machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": args.rounds,
            "calls": args.calls}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "records": records}, indent=1) + "\n")
    lines = ["# asentmax.ops.entmax on attention-like rows (CPU): this tree against a revision\n",
             f"Command: `{meta['command']}`\n",
             f"{meta['threads']} threads, {meta['cpu']}, {meta['date']}; base {base}, this tree "
             f"{meta['this_tree']}. "
             "Inputs: fp32 standard normal x 10; mixed: every third row x 0.01 (near-uniform); spread: each "
             "row x 10^u, u uniform in [-2, 1]; moderate: every row x 0.02. Each "
             f"side in its own process, {args.calls} timed calls a round, {args.rounds} alternating rounds: "
             "the median of each side's round medians.\n",
             "| inputs | mode | shape | alpha | base ms | this tree ms | speed-up |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['inputs']} | {r['mode']} | {r['shape'][0]}x{r['shape'][1]} | {r['alpha']} "
              f"| {r['base_ms']:.1f} | {r['this_tree_ms']:.1f} | {r['speedup']:.2f}x |" for r in records]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
