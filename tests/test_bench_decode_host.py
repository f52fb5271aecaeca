"""benchmarks/bench_decode_host.py on the CPU: the launches it intercepts are the ones each decoding path
makes (recorded without a GPU: nothing is launched), their arguments map to the kernels' parameters in
signature order, the real kernels are put back afterwards, each reported cell is its fastest pass, and
without CUDA the script refuses in one line."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asentmax.ops.triton import attention_decode, attention_decode_short
from asentmax.ops.triton.attention_common import mode_of
from asentmax.ops.triton.attention_decode import entmax_attention_decode
from conftest import load_benchmark

bench = load_benchmark("bench_decode_host")


def decode_call(cache, heads=8, kv_heads=2, dim=64):
    q = torch.randn(2, heads, 1, dim)
    k, v = (torch.randn(2, kv_heads, cache, dim) for _ in range(2))
    options = dict(mode=mode_of(1.5), alpha=1.5, scale=dim ** -0.5, causal=False, slopes=None, q_scale=None,
                   kpm=None, tol=3e-2, max_iter=40)
    return q, lambda: entmax_attention_decode(q, k, v, **options)


@pytest.mark.parametrize("cache, names", [(1024, ["_decode_short"]),
                                          (4096, ["_decode_scores", "_decode_output"])])
def test_the_recorded_launches_are_the_paths_kernels_with_their_arguments(cache, names):
    q, call = decode_call(cache)
    launches = bench.recorded_launches(call, forward=False)
    assert [name for name, *_ in launches] == names
    out, work = bench.argument(launches, "Out"), bench.argument(launches, "Work")
    assert out.shape == q.shape and out.dtype == q.dtype
    assert work.dim() == 1 and work.dtype == torch.float32
    for _, kernel, _, args, kwargs in launches:
        arguments = bench.ordered_arguments(kernel, args, kwargs)
        parameters = list(bench.inspect.signature(kernel.fn).parameters)
        assert len(arguments) == len(parameters)
        assert all(arguments[i] is arg for i, arg in enumerate(args))
        for name, value in kwargs.items():  # constexprs by name; launch options (num_warps) are dropped
            if name in parameters:
                assert arguments[parameters.index(name)] is value
            else:
                assert name in ("num_warps", "num_stages")


def test_the_real_kernels_are_back_after_interception():
    real = (attention_decode_short._decode_short, attention_decode._decode_scores,
            attention_decode._decode_output, attention_decode._decode_threshold)
    with bench.intercepted(forward=False) as launches:
        assert isinstance(attention_decode_short._decode_short, bench._Launch)
        decode_call(1024)[1]()
    assert len(launches) == 1
    assert (attention_decode_short._decode_short, attention_decode._decode_scores,
            attention_decode._decode_output, attention_decode._decode_threshold) == real


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_the_script_refuses_in_one_line():
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_decode_host.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "bench_decode_host.py needs a CUDA device (none found); nothing was measured"]


def test_each_cell_is_its_fastest_pass_and_the_ratio_follows():
    def row(cache, sdpa, launcher, public):
        return dict(B=1, cache=cache, path="short", launches=1, sdpa_us=sdpa, launcher_us=launcher,
                    public_us=public, launcher_vs_sdpa=launcher / sdpa)
    first = [row(1024, 40.0, 90.0, 30.0), row(4096, 20.0, 70.0, 80.0)]
    second = [row(1024, 20.0, 50.0, 60.0), row(4096, 25.0, 60.0, 85.0)]
    rows = bench.fastest_over_passes([first, second])
    assert [(r["cache"], r["sdpa_us"], r["launcher_us"], r["public_us"]) for r in rows] == [
        (1024, 20.0, 50.0, 30.0), (4096, 20.0, 60.0, 80.0)]
    assert [r["launcher_vs_sdpa"] for r in rows] == [2.5, 3.0]
    assert first[0]["sdpa_us"] == 40.0  # the passes are left as measured


def test_tritons_launches_puts_the_jit_functions_in_and_takes_them_out():
    names = [(attention_decode_short, "_decode_short"), (attention_decode, "_decode_scores"),
             (attention_decode, "_decode_threshold"), (attention_decode, "_decode_output")]
    launcher_kernels = [getattr(module, name) for module, name in names]
    with bench.tritons_launches():
        inside = [getattr(module, name) for module, name in names]
    assert inside == [getattr(kernel, "kernel", kernel) for kernel in launcher_kernels]
    assert all(not hasattr(kernel, "compiled") for kernel in inside)  # no CachedKernel among them
    assert [getattr(module, name) for module, name in names] == launcher_kernels
