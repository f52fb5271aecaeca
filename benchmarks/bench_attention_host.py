"""Host (Python) time of one entmax decoding call, kernels stubbed: what the GPU waits for at short caches.

At B=8, H=16, q_len 1, a 1K-key cache the decoding kernel takes about 26 us on an H200 and the public call
spends about as long again on the host (results/decode_gpu.md). This script measures that host part on the
CPU: every Triton kernel object of the decoding launchers (attention_decode_short._decode_short and the
split path's four kernels) is replaced by a no-op launch, so everything else still runs -- argument checks,
the backend choice, the launcher's allocations, grid and argument computation -- on CPU tensors shaped like
the GPU case (bf16, D = 64, 1,024 keys: q_len 1, q_len 4, and GQA with 4 K/V heads). Not counted: Triton's
own launch (binding and specialising the arguments, the driver call), which the stub replaces.

Median microseconds per call (under no_grad, as bench_decode_gpu.py) of
- public: asentmax.ops.attention.entmax_attention(q, k, v, alpha=1.5, causal=False, backend="triton")
  ("auto" takes the chunked backend for CPU tensors; on CUDA it resolves to "triton" by one more check);
- launcher: asentmax.ops.triton.attention_decode.entmax_attention_decode alone.

    PYTHONPATH=src python benchmarks/bench_attention_host.py --out results
    PYTHONPATH=src python benchmarks/bench_attention_host.py --before-src /tmp/old/src \
        --before-label 86cb561 --out results
With --before-src the same measurement also runs in subprocesses importing asentmax from that directory
(e.g. an older checkout), rounds interleaved with this tree's (the machine is shared), and the table shows
both. Writes results/attention_host_cpu.json and results/attention_host_cpu.md.
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # makes the triton backend available on the CPU; no kernel runs

import torch  # noqa: E402

# (label, B, H, Hkv, q_len, D, cache)
CASES = [("q_len 1", 8, 16, 16, 1, 64, 1024), ("q_len 4", 8, 16, 16, 4, 64, 1024),
         ("GQA Hkv 4", 8, 16, 4, 1, 64, 1024)]


class _NoLaunch:
    """Stands for a Triton kernel: `kernel[grid](*args, **kwargs)` takes its arguments and does nothing."""

    def __getitem__(self, grid):
        return self._launch

    @staticmethod
    def _launch(*args, **kwargs):
        return None


def stub_kernels():
    from asentmax.ops.triton import attention_decode, attention_decode_short

    attention_decode_short._decode_short = _NoLaunch()
    for name in ("_decode_scores", "_decode_threshold", "_decode_output", "_decode_reduce"):
        if hasattr(attention_decode, name):  # _decode_reduce: trees from before it joined _decode_output
            setattr(attention_decode, name, _NoLaunch())


def median_us(fn, calls, repeats):
    """Median over `repeats` of the mean time of `calls` back-to-back calls, in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def measure(calls, repeats):
    """{case label: {"public_us", "launcher_us"}} for the asentmax on sys.path."""
    stub_kernels()
    from asentmax.ops.attention import entmax_attention
    from asentmax.ops.triton.attention_common import mode_of
    from asentmax.ops.triton.attention_decode import entmax_attention_decode

    result = {}
    torch.manual_seed(0)
    for label, b, h, hkv, nq, dim, cache in CASES:
        q = torch.randn(b, h, nq, dim, dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, cache, dim, dtype=torch.bfloat16) for _ in range(2))
        options = dict(mode=mode_of(1.5), alpha=1.5, scale=dim ** -0.5, causal=False, slopes=None,
                       q_scale=None, kpm=None, tol=3e-2, max_iter=40)

        def public(q=q, k=k, v=v):
            return entmax_attention(q, k, v, alpha=1.5, causal=False, backend="triton")

        def launcher(q=q, k=k, v=v, options=options):
            return entmax_attention_decode(q, k, v, **options)

        with torch.no_grad():
            public_us, launcher_us = median_us(public, calls, repeats), median_us(launcher, calls, repeats)
        result[label] = dict(B=b, H=h, Hkv=hkv, q_len=nq, D=dim, cache=cache, public_us=public_us,
                             launcher_us=launcher_us)
    return result


def run_tree(src, calls, repeats):
    """measure() in a fresh interpreter importing asentmax from `src`."""
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, __file__, "--child", "--calls", str(calls), "--repeats",
                          str(repeats)], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for attention_host_cpu.{json,md}")
    parser.add_argument("--before-src", default=None, help="src/ of an older checkout to compare with")
    parser.add_argument("--before-label", default=None, help="what --before-src is (a commit)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per tree")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.calls, args.repeats)))
        return

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src")
    trees = {"after": os.path.abspath(here)}
    if args.before_src:
        trees = {"before": os.path.abspath(args.before_src), **trees}
    runs = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            runs[name].append(run_tree(src, args.calls, args.repeats))
    table = {name: {label: {key: (statistics.median(r[label][key] for r in rounds)
                                  if key.endswith("_us") else rounds[0][label][key])
                            for key in rounds[0][label]} for label in rounds[0]}
             for name, rounds in runs.items()}
    if args.before_label:
        trees["before"] = f"{trees['before']} ({args.before_label})"
    record = dict(trees=trees, rounds=args.rounds, calls=args.calls, repeats=args.repeats,
                  torch=torch.__version__, python=platform.python_version(), machine=platform.processor()
                  or platform.machine(), command=shlex.join(sys.argv), results=table)
    print(json.dumps(table, indent=1))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention_host_cpu.json"), "w") as f:
            json.dump(record, f, indent=1)
        with open(os.path.join(args.out, "attention_host_cpu.md"), "w") as f:
            f.write(markdown(record))


def markdown(record):
    names = list(record["results"])
    header = "| case | B | H | Hkv | q_len | D | cache | " + " | ".join(
        f"{what} us ({name})" for name in names for what in ("public", "launcher")) + " |"
    lines = ["# Host time of entmax decoding, kernels stubbed (CPU)", "",
             f"Command: `{record['command']}` (torch {record['torch']}, Python {record['python']}; "
             f"{record['rounds']} interleaved rounds of {record['repeats']} x {record['calls']} calls)", "",
             "Median us per call, bf16 CPU tensors, alpha = 1.5, non-causal, no_grad, every Triton kernel of "
             "the decoding launchers a no-op (the launchers' own work runs). public = entmax_attention(..., "
             "backend='triton'), launcher = entmax_attention_decode. Trees: "
             + ", ".join(f"{name} = {src}" for name, src in record["trees"].items()), "",
             header, "|" + "---|" * (7 + 2 * len(names))]
    for label in record["results"][names[-1]]:
        row = record["results"][names[-1]][label]
        cells = [label] + [str(row[key]) for key in ("B", "H", "Hkv", "q_len", "D", "cache")]
        cells += [f"{record['results'][name][label][key]:.1f}" for name in names
                  for key in ("public_us", "launcher_us")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
