"""Where the host time of one entmax decoding call goes, beside SDPA's, on one GPU (issue 14 item 3).

results/decode_gpu.md measures the decoding rows that miss <= 2x SDPA as host-bound: one call of the
launcher costs 42-85 us of host time while SDPA's whole call takes 13-33 us. This splits that host time
into its parts, for those rows (grouped caches of 1K-4K keys, and single-sequence GQA), each the host
microseconds of one call (bench_decode_gpu.host_us: a loop of calls timed before the GPU is waited for):
- sdpa: torch SDPA (enable_gqa), the peer;
- public: `entmax_attention(..., alpha, backend="triton")` under no_grad;
- launcher: `entmax_attention_decode` (the path it takes, as in results/decode_gpu.md);
- launcher, no launch: the same call with each Triton launch replaced by a no-op: the launcher's Python
  (argument arithmetic and the result buffers of decode_buffers);
- buffers: `decode_buffers` alone (the workspace and the three results: four torch.empty);
- jit launches: the path's Triton launches alone, each through Triton's own launch path (`kernel[grid](*args,
  **kwargs)` on the triton.jit function, with the arguments the launcher passed: argument binding and
  specialisation, Triton's cache lookup and the launch);
- cached launches: the same through the launcher's kernels (ops/triton/launch.py's CachedKernel: our key, its
  lookup and the kept compiled kernel's launch), as the launcher makes them since the twenty-first session;
- compiled launches: the same kernels launched through the compiled kernels that those calls returned
  (`compiled[grid](*args)`, every argument in signature order), without any binding or key: the floor of a
  launcher that keeps its compiled kernels. The script checks that these launches write the launcher's result;
- public and launcher, Triton's launches: the public call and the launcher with the kernels put back to
  Triton's launch path (the launcher of the twentieth session), side by side with the two above.
The parts do not add up exactly (each is timed alone), but they say which one to cut.

    PYTHONPATH=src python benchmarks/bench_decode_host.py --out results
writes results/decode_host.json and results/decode_host.md (about 25 s a pass on an H200).
"""

import argparse
import importlib.util
import inspect
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

# (B, H, Hkv, q_len, D, cache): results/decode_gpu.md's rows above 2x SDPA, and a multi-head one for scale
CASES = [(8, 16, 4, 1, 64, 2048), (8, 16, 4, 1, 64, 4096), (8, 16, 4, 1, 128, 4096), (8, 32, 4, 1, 128, 4096),
         (1, 32, 8, 1, 128, 1024), (1, 32, 8, 1, 128, 4096), (8, 16, 16, 1, 128, 1024)]
KERNELS = {  # the module of each decoding launcher and the Triton kernels it launches by module global
    "asentmax.ops.triton.attention_decode_short": ("_decode_short",),
    "asentmax.ops.triton.attention_decode": ("_decode_scores", "_decode_threshold", "_decode_output"),
}


def bench_decode_gpu():
    """benchmarks/bench_decode_gpu.py as a module (its host_us)."""
    path = Path(__file__).with_name("bench_decode_gpu.py")
    spec = importlib.util.spec_from_file_location("bench_decode_gpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Launch:
    """Stands in for a Triton kernel in its module: `kernel[grid](*args, **kwargs)` appends (name, kernel,
    grid, args, kwargs) to `launches` and launches the real kernel only when `forward`."""

    def __init__(self, name, kernel, launches, forward):
        self.name, self.kernel, self.launches, self.forward = name, kernel, launches, forward

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.name, self.kernel, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs) if self.forward else None
        return launch


@contextmanager
def kernels_replaced(stand_in):
    """Inside, every decoding kernel of KERNELS is stand_in(name, kernel) in its module; put back after."""
    saved = []
    for module_name, names in KERNELS.items():
        module = sys.modules[module_name]
        for name in names:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, stand_in(name, getattr(module, name)))
    try:
        yield
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)


@contextmanager
def intercepted(forward):
    """Every decoding kernel of KERNELS replaced by a _Launch while inside; yields the list of launches."""
    launches = []
    with kernels_replaced(lambda name, kernel: _Launch(name, kernel, launches, forward)):
        yield launches


def jit_kernel(kernel):
    """The triton.jit function behind a launcher's kernel (a launch.CachedKernel, or the function itself)."""
    return getattr(kernel, "kernel", kernel)


def tritons_launches():
    """Inside, the decoding launchers launch through Triton's own launch path (each kernel of KERNELS its
    triton.jit function), as before launch.py."""
    return kernels_replaced(lambda name, kernel: jit_kernel(kernel))


def recorded_launches(call, forward=True):
    """The Triton launches of one call() (name, kernel, grid, args, kwargs), made for real when `forward`
    (without a GPU: forward=False records what the launcher would launch)."""
    for module_name in KERNELS:
        importlib.import_module(module_name)
    with intercepted(forward) as launches:
        call()
    return launches


def argument(launches, name):
    """The tensor a recorded launch passed as the kernel parameter `name` (e.g. "Out", "Work"), from the
    first launch that has one."""
    for _, kernel, _, args, kwargs in launches:
        names = list(inspect.signature(kernel.fn).parameters)
        if name in names:
            return ordered_arguments(kernel, args, kwargs)[names.index(name)]
    raise KeyError(name)


def ordered_arguments(kernel, args, kwargs):
    """Every parameter of the JIT kernel in signature order (constexprs included: a compiled kernel's
    runner takes them all, as JITFunction.run passes them), from a launch's args and kwargs; launch options
    such as num_warps, which are not parameters, are dropped."""
    parameters = inspect.signature(kernel.fn).parameters
    bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in parameters})
    bound.apply_defaults()
    return list(bound.arguments.values())


def bench_case(b, h, hkv, nq, dim, cache, alpha, host_us):
    from asentmax.ops.attention import entmax_attention
    from asentmax.ops.triton.attention_common import decode_buffers, mode_of
    from asentmax.ops.triton.attention_decode import entmax_attention_decode, takes_short_path

    q = torch.randn(b, h, nq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, hkv, cache, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    options = dict(mode=mode_of(alpha), alpha=alpha, scale=dim ** -0.5, causal=False, slopes=None,
                   q_scale=None, kpm=None, tol=3e-2, max_iter=40)

    def launcher():
        return entmax_attention_decode(q, k, v, **options)

    with torch.no_grad():
        expected = launcher()[0].clone()
        launches = recorded_launches(launcher)
        out, workspace = argument(launches, "Out"), argument(launches, "Work")
        compiled = [(jit_kernel(kernel)[grid](*args, **kwargs), grid, ordered_arguments(kernel, args, kwargs))
                    for _, kernel, grid, args, kwargs in launches]

        def jit_launches():
            for _, kernel, grid, args, kwargs in launches:
                jit_kernel(kernel)[grid](*args, **kwargs)

        def cached_launches():
            for _, kernel, grid, args, kwargs in launches:
                kernel[grid](*args, **kwargs)

        grids = [tuple(grid) + (1,) * (3 - len(grid)) for _, grid, _ in compiled]

        def compiled_launches():
            for (kernel, _, arguments), grid in zip(compiled, grids, strict=True):
                kernel[grid](*arguments)

        out.zero_()
        compiled_launches()
        torch.cuda.synchronize()
        if not torch.equal(out, expected):
            raise SystemExit(f"case {(b, h, hkv, nq, dim, cache)}: the compiled launches did not write the "
                             "launcher's result; the argument order is wrong, nothing is reported")

        with intercepted(forward=False):
            no_launch_us = host_us(launcher)

        def public():
            return entmax_attention(q, k, v, alpha=alpha, causal=False, backend="triton")

        with tritons_launches():
            public_triton_us, launcher_triton_us = host_us(public), host_us(launcher)
        row = dict(B=b, H=h, Hkv=hkv, q_len=nq, D=dim, cache=cache, alpha=alpha,
                   path="short" if takes_short_path(b, h, hkv, nq, cache, False) else "split",
                   launches=len(launches),
                   sdpa_us=host_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != h)),
                   public_us=host_us(public), public_triton_us=public_triton_us,
                   launcher_us=host_us(launcher), launcher_triton_us=launcher_triton_us,
                   launcher_no_launch_us=no_launch_us,
                   buffers_us=host_us(lambda: decode_buffers(q, workspace.numel())),
                   jit_launches_us=host_us(jit_launches), cached_launches_us=host_us(cached_launches),
                   compiled_launches_us=host_us(compiled_launches))
    add_ratios(row)
    print({key: round(val, 2) if isinstance(val, float) else val for key, val in row.items()}, flush=True)
    return row


def add_ratios(row):
    """The public call's and the launcher's host time over SDPA's, now and with Triton's launches."""
    for name in ("public", "launcher"):
        row[f"{name}_vs_sdpa"] = row[f"{name}_us"] / row["sdpa_us"]
        if f"{name}_triton_us" in row:
            row[f"{name}_triton_vs_sdpa"] = row[f"{name}_triton_us"] / row["sdpa_us"]


def fastest_over_passes(passes):
    """One row a case: each host-microseconds column the fastest of the passes (rows in the same case order
    in every pass), the ratios to SDPA from those."""
    rows = []
    for measured in zip(*passes, strict=True):
        row = dict(measured[0])
        for key in row:
            if key.endswith("_us"):
                row[key] = min(pass_row[key] for pass_row in measured)
        add_ratios(row)
        rows.append(row)
    return rows


COLUMNS = [("B", "B"), ("H", "H"), ("Hkv", "Hkv"), ("q_len", "q_len"), ("D", "D"), ("cache", "cache"),
           ("path", "path"), ("launches", "launches"), ("sdpa_us", "SDPA us"), ("public_us", "public us"),
           ("public_triton_us", "public, Triton's launches us"), ("launcher_us", "launcher us"),
           ("launcher_triton_us", "launcher, Triton's launches us"),
           ("launcher_no_launch_us", "launcher, no launch us"), ("buffers_us", "buffers us"),
           ("jit_launches_us", "jit launches us"), ("cached_launches_us", "cached launches us"),
           ("compiled_launches_us", "compiled launches us"), ("public_vs_sdpa", "public / SDPA"),
           ("public_triton_vs_sdpa", "public, Triton's / SDPA"), ("launcher_vs_sdpa", "launcher / SDPA"),
           ("launcher_triton_vs_sdpa", "launcher, Triton's / SDPA")]


def markdown(report):
    info = report["info"]
    lines = [f"# Host time of one entmax decoding call, by part, beside SDPA on {info['gpu']} "
             f"(torch {info['torch']}, triton {info['triton']})", "",
             f"Command: `{info['command']}` ({info['seconds']:.0f} s)", "",
             f"bf16, non-causal, alpha = {info['alpha']}. Host microseconds of one call: the fastest of 5 "
             f"loops of 100 calls timed before the GPU is waited for, the fastest of {info['passes']} passes "
             "over the cases (decode_host.json has every pass). The columns are the parts of "
             "benchmarks/bench_decode_host.py's docstring, each timed alone.", "",
             "| " + " | ".join(title for _, title in COLUMNS) + " |",
             "|" + "---|" * len(COLUMNS)]
    for row in report["rows"]:
        cells = [f"{row[key]:.1f}" if isinstance(row[key], float) else str(row[key]) for key, _ in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="directory for decode_host.json and decode_host.md")
    parser.add_argument("--alpha", type=float, default=1.5, help="entmax alpha (1 = softmax)")
    parser.add_argument("--passes", type=int, default=3,
                        help="times over the case list; each cell is its fastest pass (a first pass over the "
                             "first cases ran 2x slower on the H200: a warm-up)")
    args = parser.parse_args()
    if args.passes < 1:
        parser.error("--passes must be >= 1")
    if not (math.isfinite(args.alpha) and 1.0 <= args.alpha <= 2.0):
        parser.error("--alpha must be in [1, 2] (the decode kernels' range)")
    if not torch.cuda.is_available():
        sys.exit("bench_decode_host.py needs a CUDA device (none found); nothing was measured")
    import triton

    torch.manual_seed(0)
    started = time.perf_counter()
    host_us = bench_decode_gpu().host_us
    info = dict(command="PYTHONPATH=src python " + " ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__, alpha=args.alpha, passes=args.passes)
    passes = [[bench_case(*case, alpha=args.alpha, host_us=host_us) for case in CASES]
              for _ in range(args.passes)]
    report = dict(info=info, rows=fastest_over_passes(passes), passes=passes)
    info["seconds"] = time.perf_counter() - started
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode_host.json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(args.out, "decode_host.md"), "w") as fh:
        fh.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
