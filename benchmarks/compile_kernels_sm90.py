"""Compile the Triton kernels (fused entmax attention, row-wise entmax) for Hopper GPUs (sm_90: H100, H200)
on a machine without a GPU.

The Triton interpreter (TRITON_INTERPRET=1, how CI runs the kernels) does not compile them, so a kernel that
runs there can still fail to compile for a GPU (for example two returns of different shapes in one jit
function). This script runs the real launchers of the forward, backward and decoding kernels on small CPU
tensors with `JITFunction.run` replaced by a recorder, then compiles each recorded launch for sm_90 with
exactly the arguments and constexprs the launcher passed (triton.compile with a GPUTarget needs no GPU), and
prints the registers, spilled bytes (STACK), shared memory and compile seconds of each kernel. Exit status 1
if any kernel fails to compile.

    python benchmarks/compile_kernels_sm90.py            # alpha 1, 1.25, 1.5, 2; head dims 64, 128 (and the
                                                         # training shape: head dim 32, 90 keys)
    python benchmarks/compile_kernels_sm90.py --quick    # alpha 1.5; what tests/test_triton_compile.py runs
    python benchmarks/compile_kernels_sm90.py --quick --dtype float32   # the fused kernels on fp32
                                      # inputs (dots in input_precision "ieee"; results/fp32_kernels_sm90.md)
    python benchmarks/compile_kernels_sm90.py --candidates 128   # the tile shapes that
                                      # benchmarks/tune_attention_gpu.py sweeps at head dim 128, each kernel
                                      # as the library and as the sweep launch it (alpha 1.5)
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, native_specialize_impl

from asentmax.ops.triton import attention_common, attention_decode
from asentmax.ops.triton.attention_bwd import entmax_attention_bwd
from asentmax.ops.triton.attention_common import forward_blocks, kernel_blocks, mode_of
from asentmax.ops.triton.attention_decode import entmax_attention_decode
from asentmax.ops.triton.attention_fwd import entmax_attention_fwd
from asentmax.ops.triton.entmax_rows import MAX_BLOCK_N, entmax_rows

TARGET = GPUTarget("cuda", 90, 32)
MAX_SHARED_BYTES = 232448  # the most shared memory one program may take on sm_90 (227 KB)


def record_launches(alphas, dims, dtype=torch.bfloat16):
    """[(kernel, positional args, keyword args)] of every launch the launchers make for these cases (fused
    attention on `dtype` inputs, and the row-wise entmax kernels, forward and backward, short and long
    rows)."""
    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        for alpha in alphas:
            for dim in dims:
                launch_all(alpha, dim, dtype)
                launch_decode_chunks(alpha, dim)
            launch_training_shape(alpha, dtype)
            if alpha != 1.0:
                for n in (1000, MAX_BLOCK_N + 1):
                    x = torch.randn(2, n, requires_grad=True)
                    entmax_rows(x, alpha).backward(torch.ones(2, n))
    finally:
        JITFunction.run = original
    return launches


def launch_all(alpha, dim, dtype=torch.bfloat16, batch=1, heads=2, n=96):
    """Forward, backward and decoding launchers on `dtype` inputs, causal, with ALiBi, q_scale and key
    padding; forward and backward at n // 2, n and 2n + 8 keys: the forward's single-tile path with both
    register tile widths (where register_tile_keys allows it) and its multi-pass path."""
    options = dict(mode=mode_of(alpha), alpha=alpha, scale=dim ** -0.5, causal=True,
                   slopes=torch.ones(batch, heads))
    for length in (n // 2, n, 2 * n + 8):
        x = torch.randn(batch, heads, length, dim, dtype=dtype)
        forward_backward(x, x, x, dict(options, q_scale=torch.ones(batch, heads, length),
                                       kpm=torch.ones(batch, length, dtype=torch.uint8)))
    q = torch.randn(batch, heads, n, dim, dtype=dtype)
    options = dict(options, q_scale=torch.ones(batch, heads, n), kpm=torch.ones(batch, n, dtype=torch.uint8))
    # decoding: the one-launch kernel (scores in registers at 4 and 8 warps, and re-read with 4 rows at 4096
    # keys), then the split kernels (several chunks, a streamed threshold row and the reduce kernel); the last
    # two with grouped K/V (one KV head: both query heads in one program)
    for n_q, cache, kv_heads in ((1, n, heads), (1, 4096, heads), (4, 4096, heads), (1, 5000, heads),
                                 (1, 2048, 1), (4, 5000, 1)):
        k_cache, v_cache = (torch.randn(batch, kv_heads, cache, dim, dtype=dtype) for _ in range(2))
        entmax_attention_decode(q[:, :, :n_q], k_cache, v_cache, tol=3e-2, max_iter=40,
                                **dict(options, q_scale=options["q_scale"][:, :, :n_q].contiguous(),
                                       kpm=torch.ones(batch, cache, dtype=torch.uint8)))


def launch_decode_chunks(alpha, dim, batch=8, heads=16):
    """The decoding launcher at the benchmark's shapes (bf16, q_len 1 and 4; bench_decode_gpu.py): grouped
    caches (4 KV heads) of 1K and 2K keys on the one-launch kernel (a program per query head), of 4K keys on
    the split path (packs of 4 heads, chunks of 1024 keys, 4 or 16 rows), and a multi-head one of 4K keys,
    solving the thresholds in the output kernel or not; the one-launch kernel's tuned tiles (1K keys) in
    fp16 and fp32 (whose tiles hold half as many keys: the shared memory limit); and a static cache's steps
    (kv_lengths read on the device) on the one-launch kernel and both split variants. Each case under both
    of the launcher's rules: called directly, and under CUDA-graph capture (graphed_launch replaced: the split
    path from 1K grouped keys, chunks of 256-1024, the thresholds in their own launch)."""
    cases = [(n_q, kv_heads, cache, torch.bfloat16, False) for n_q, kv_heads, cache in (
        (1, 4, 1024), (1, 4, 2048), (1, 4, 4096), (4, 4, 4096), (1, heads, 4096))]
    cases += [(1, 4, 1024, torch.float16, False), (4, 4, 1024, torch.float32, False)]
    cases += [(n_q, 4, cache, torch.bfloat16, True) for n_q, cache in ((1, 1024), (1, 4096), (4, 4096))]
    direct_rule = attention_decode.graphed_launch
    try:
        for graphed in (False, True):
            attention_decode.graphed_launch = lambda q, graphed=graphed: graphed
            for n_q, kv_heads, cache, dtype, with_lengths in cases:
                # zeros: the launches are recorded, not run (bf16 randn of these sizes takes seconds on a CPU)
                q = torch.zeros(batch, heads, n_q, dim, dtype=dtype)
                k_cache, v_cache = (torch.zeros(batch, kv_heads, cache, dim, dtype=dtype) for _ in range(2))
                lengths = torch.full((batch,), cache - 100, dtype=torch.int32) if with_lengths else None
                entmax_attention_decode(q, k_cache, v_cache, mode=mode_of(alpha), alpha=alpha,
                                        scale=dim ** -0.5, causal=False, slopes=None, q_scale=None, kpm=None,
                                        tol=3e-2, max_iter=40, lengths=lengths)
    finally:
        attention_decode.graphed_launch = direct_rule


def forward_backward(q, k, v, options, write_support=True):
    """The forward (with o2) and backward launchers on q, k, v (B, H, N, D), with the tile shapes of
    attention_common.kernel_blocks."""
    blocks, *backward_blocks = kernel_blocks(q.shape[-1], q.shape[2])
    out, o2, tau, inv_z, _, tile_max, _ = entmax_attention_fwd(q, k, v, write_o2=True, tol=3e-2, max_iter=40,
                                                              blocks=blocks, write_support=write_support,
                                                              **options)
    entmax_attention_bwd(torch.randn_like(out), q, k, v, o2, tau, inv_z, tile_max, blocks=blocks,
                         backward_blocks=backward_blocks, **options)


def record_candidates(dim):
    """Launches of every tile shape tune_attention_gpu.py sweeps at head dim `dim` (its default candidates,
    each kernel's in turn set in attention_common.KERNEL_BLOCKS): the library's variant (ALiBi, q_scale, key
    padding, launch_all) and the sweep's two (no options, and ALiBi alone; o2 and no support written)."""
    from tune_attention_gpu import DEFAULT_CANDIDATES, candidate_configs

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    original, saved = JITFunction.run, attention_common.KERNEL_BLOCKS[dim]
    JITFunction.run = record
    try:
        for _, config in candidate_configs(saved, DEFAULT_CANDIDATES[dim]):
            attention_common.KERNEL_BLOCKS[dim] = config
            launch_all(1.5, dim)
            x = torch.randn(1, 2, 300, dim, dtype=torch.bfloat16)
            for slopes in (None, torch.ones(1, 2)):
                forward_backward(x, x, x, dict(mode=mode_of(1.5), alpha=1.5, scale=dim ** -0.5, causal=True,
                                               slopes=slopes, q_scale=None, kpm=None), write_support=False)
    finally:
        JITFunction.run = original
        attention_common.KERNEL_BLOCKS[dim] = saved
    fused = ("_entmax_attention_fwd", "_entmax_attention_bwd_dq", "_entmax_attention_bwd_dkdv")
    return [launch for launch in launches if launch[0].__name__ in fused and launch[2]["BLOCK_D"] == dim]


def launch_training_shape(alpha, dtype=torch.bfloat16, batch=1, heads=2, n=90, dim=32):
    """The MQMTAR training shape (widths up to 90 tokens, head_dim 32, bf16 under autocast, causal, ALiBi,
    no key padding), without q_scale (entmax) and with it (ASEntmax): the kernels of a training step, the
    forward by its single-tile path and, for comparison, by the multi-pass path (single_tile=False)."""
    q, k, v = (torch.randn(batch, heads, n, dim, dtype=dtype) for _ in range(3))
    for q_scale in (None, torch.ones(batch, heads, n)):
        options = dict(mode=mode_of(alpha), alpha=alpha, scale=dim ** -0.5, causal=True,
                       slopes=torch.ones(batch, heads), q_scale=q_scale, kpm=None)
        forward_backward(q, k, v, options)
        entmax_attention_fwd(q, k, v, write_o2=True, tol=3e-2, max_iter=40, blocks=forward_blocks(dim, n),
                             single_tile=False, **options)


def compile_launch(fn, args, kwargs):
    """Compile one recorded launch for sm_90 with the specialisation a GPU launch gives it (an int argument
    equal to 1 becomes a constant, ints divisible by 16 and 16-byte aligned pointers are marked so, except
    where the kernel says do_not_specialize), which decides vector widths and software pipelining; returns
    the compiled kernel."""
    constexprs, signature, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        value = args[i] if i < len(args) else kwargs[param.name]
        if param.is_constexpr:
            constexprs[param.name] = value
            signature[param.name] = "constexpr"
            continue
        kind, spec = native_specialize_impl(BaseBackend, value, False, not param.do_not_specialize,
                                            not param.do_not_specialize_on_alignment)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = spec
        elif isinstance(spec, str):
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    options = {name: kwargs[name] for name in ("num_warps", "num_stages") if name in kwargs}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=TARGET, options=options)


def resource_usage(kernel):
    """'REG:... STACK:...' of the compiled kernel from cuobjdump, or '' where cuobjdump is missing."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(kernel.asm["cubin"])
        fh.flush()
        text = subprocess.run([tool, "-res-usage", fh.name], capture_output=True, text=True).stdout
    fields = [line.split() for line in text.splitlines() if "REG:" in line]
    return " ".join(f for f in fields[0] if f.startswith(("REG:", "STACK:"))) if fields else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="alpha 1.5 only")
    parser.add_argument("--candidates", type=int, metavar="HEAD_DIM",
                        help="compile tune_attention_gpu.py's candidate tile shapes at this head dim instead")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16",
                        help="dtype of q, k, v in the attention launches (forward, backward, decoding; "
                             "default: bfloat16)")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("compile_kernels_sm90.py compiles for a GPU: run it without TRITON_INTERPRET=1")
    alphas = (1.5,) if args.quick else (1.0, 1.25, 1.5, 2.0)
    if args.candidates and args.dtype != "bfloat16":
        sys.exit("compile_kernels_sm90.py: --candidates compiles bf16 launches; leave out --dtype")
    launches = record_candidates(args.candidates) if args.candidates else \
        record_launches(alphas, (64, 128), getattr(torch, args.dtype))
    seen, failures = set(), 0
    for fn, call_args, kwargs in launches:
        key = (fn.__name__, repr(sorted((k, v) for k, v in kwargs.items())))
        if key in seen:
            continue
        seen.add(key)
        shown = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
        try:
            start = time.perf_counter()
            kernel = compile_launch(fn, call_args, kwargs)
            seconds = time.perf_counter() - start
            shared = kernel.metadata.shared
            if shared > MAX_SHARED_BYTES:  # compiles, but the launch would fail on the GPU
                raise RuntimeError(f"{shared} bytes of shared memory, above the {MAX_SHARED_BYTES} of sm_90")
            print(f"ok    {fn.__name__} {shown} {resource_usage(kernel)} SMEM:{shared} {seconds:.1f}s",
                  flush=True)
        except Exception as exc:  # report every kernel, then fail
            failures += 1
            print(f"FAIL  {fn.__name__} {shown}: {type(exc).__name__}: {exc}", flush=True)
    print(f"{len(seen)} kernels compiled for sm_90, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
