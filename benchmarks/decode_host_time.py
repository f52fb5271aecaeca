"""Host time of the decoding launchers' Python part, measured on the CPU (no GPU needed).

The launchers of asentmax/ops/triton/attention_decode*.py (arXiv:2506.16640, section 2, forward only) are
called on CPU tensors at bench_decode_gpu.py's shapes with `JITFunction.run` replaced by a no-op, so what is
timed is the launcher's own work (shape arithmetic, buffer allocations, argument lists, the kernel's
`kernel[grid]` indexing) without Triton's launch. CPU allocations stand in for CUDA ones (the caching
allocator's cost is of the same order, a few microseconds each). Timed in the thread's CPU time
(time.thread_time), so that other processes on a shared machine do not count. Prints microseconds a call,
the fastest of several loops, per (launcher, shape).

    PYTHONPATH=src python benchmarks/decode_host_time.py
"""

import time

import torch
from triton.runtime.jit import JITFunction

from asentmax.ops.triton.attention_decode import entmax_attention_decode, entmax_attention_decode_split
from asentmax.ops.triton.attention_decode_grouped import entmax_attention_decode_grouped
from asentmax.ops.triton.attention_decode_short import entmax_attention_decode_short

CASES = [(8, 16, 16, 1, 64, 1024), (8, 16, 4, 1, 64, 1024), (8, 16, 4, 1, 128, 4096),
         (1, 32, 8, 1, 128, 4096), (8, 16, 16, 1, 64, 16384)]  # (B, H, Hkv, q_len, D, cache)


def host_us(fn, calls=2000, rounds=7):
    """CPU microseconds of one fn() call: the fastest of `rounds` loops of `calls` calls."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, time.thread_time() - start)
    return best / calls * 1e6


def main():
    launchers = {"launcher": entmax_attention_decode, "short": entmax_attention_decode_short,
                 "split": entmax_attention_decode_split, "grouped": entmax_attention_decode_grouped}
    original = JITFunction.run
    JITFunction.run = lambda self, *args, **kwargs: None
    try:
        for b, h, hkv, n_q, dim, cache in CASES:
            q = torch.zeros(b, h, n_q, dim, dtype=torch.bfloat16)
            k = torch.zeros(b, hkv, cache, dim, dtype=torch.bfloat16)
            options = dict(mode=1, alpha=1.5, scale=dim ** -0.5, causal=False, slopes=None, q_scale=None,
                           kpm=None, tol=3e-2, max_iter=40)
            times = {name: host_us(lambda fn=fn, q=q, k=k, options=options: fn(q, k, k, **options))
                     for name, fn in launchers.items()}
            print(f"B {b} H {h} Hkv {hkv} q_len {n_q} D {dim} cache {cache}: "
                  + ", ".join(f"{name} {us:.1f} us" for name, us in times.items()), flush=True)
    finally:
        JITFunction.run = original


if __name__ == "__main__":
    main()
