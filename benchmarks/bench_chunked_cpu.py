"""CPU benchmark of the chunked entmax attention backend (asentmax.ops.chunked, docs/method.md section 3):
time and peak memory of a causal forward + backward pass at growing lengths, side by side with the dense
`reference` backend (where it fits) and torch SDPA (softmax, alpha = 1 only), plus the chunked-vs-reference
error. Each measurement runs in its own subprocess so peak RSS (resource.getrusage ru_maxrss) is its own.

    .venv/bin/python benchmarks/bench_chunked_cpu.py                       # default: up to 65,536 tokens
    .venv/bin/python benchmarks/bench_chunked_cpu.py --lengths 1024 4096   # quick

Writes results/chunked_cpu.json and results/chunked_cpu.md.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BATCH, HEADS, DIM = 1, 4, 32


def measure(backend, n, alpha, repeats, save_to):
    """Child process: time forward and backward, report peak RSS growth; optionally save out and grads."""
    import torch.nn.functional as F

    from asentmax.ops.attention import entmax_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(BATCH, HEADS, n, DIM, requires_grad=True) for _ in range(3))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    forward_s, backward_s = [], []
    for _ in range(repeats):
        q.grad = k.grad = v.grad = None
        start = time.perf_counter()
        if backend == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = entmax_attention(q, k, v, alpha=alpha, causal=True, backend=backend)
        middle = time.perf_counter()
        out.backward(torch.ones_like(out))
        forward_s.append(middle - start)
        backward_s.append(time.perf_counter() - middle)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if save_to:
        torch.save({"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}, save_to)
    finite = bool(torch.isfinite(out).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all())
    return {"backend": backend, "n": n, "alpha": alpha, "repeats": repeats, "finite": finite,
            "forward_s": statistics.median(forward_s), "backward_s": statistics.median(backward_s),
            "peak_rss_bytes": rss_after, "peak_rss_growth_bytes": rss_after - rss_before}


def run_child(backend, n, alpha, repeats, save_to=None):
    command = [sys.executable, __file__, "--child", backend, str(n), str(alpha), str(repeats), save_to or ""]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"backend": backend, "n": n, "alpha": alpha, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def max_error(path_a, path_b):
    a, b = torch.load(path_a), torch.load(path_b)
    return {name: (a[name] - b[name]).abs().max().item() for name in a}


def write_markdown(rows, command, path):
    title = f"# Chunked entmax attention on CPU (B={BATCH}, H={HEADS}, D={DIM}, fp32, causal, fwd + bwd)"
    lines = [title, "",
             f"Command: `{command}`", "",
             "| alpha | N | backend | forward s | backward s | peak RSS growth MiB | max err vs reference |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['alpha']} | {r['n']} | {r['backend']} | failed: {r['error']} | | | |")
            continue
        err = r.get("max_error_vs_reference")
        err_text = "" if err is None else ", ".join(f"{k} {v:.1e}" for k, v in err.items())
        lines.append(f"| {r['alpha']} | {r['n']} | {r['backend']} | {r['forward_s']:.2f} "
                     f"| {r['backward_s']:.2f} | {r['peak_rss_growth_bytes'] / 2**20:.0f} | {err_text} |")
    lines += ["", "Times are medians over `repeats` runs in one subprocess per row (1 run at the largest N); "
              "peak RSS growth = ru_maxrss after minus before the runs, inputs excluded. "
              "Dense fp32 logits alone would take N^2 * H * 4 bytes (16 GiB per tensor at N = 65,536)."]
    path.write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 65536])
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.5, 1.0])
    parser.add_argument("--reference-max", type=int, default=4096,
                        help="largest N run on the dense reference")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "results" / "chunked_cpu"))
    args = parser.parse_args()
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)  # at start
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in args.alphas:
            for n in args.lengths:
                repeats = 1 if n > 16384 else args.repeats
                chunked_file = os.path.join(tmp, f"chunked_{alpha}_{n}.pt")
                reference_file = os.path.join(tmp, f"reference_{alpha}_{n}.pt")
                with_reference = n <= args.reference_max
                chunked = run_child("chunked", n, alpha, repeats, chunked_file if with_reference else None)
                rows.append(chunked)
                print(json.dumps(chunked), flush=True)
                if with_reference:
                    reference = run_child("reference", n, alpha, repeats, reference_file)
                    rows.append(reference)
                    print(json.dumps(reference), flush=True)
                    if "error" not in chunked and "error" not in reference:
                        chunked["max_error_vs_reference"] = max_error(chunked_file, reference_file)
                if alpha == 1.0:
                    sdpa = run_child("sdpa", n, alpha, repeats)
                    rows.append(sdpa)
                    print(json.dumps(sdpa), flush=True)
    command = "python " + " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:])
    meta = {"command": command, "git_commit": git.stdout.strip(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "shape": {"batch": BATCH, "heads": HEADS, "dim": DIM}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    write_markdown(rows, command, out.with_suffix(".md"))
    print(out.with_suffix(".md").read_text())


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        backend, n, alpha, repeats, save_to = sys.argv[2:7]
        print(json.dumps(measure(backend, int(n), float(alpha), int(repeats), save_to or None)))
    else:
        main()
