"""ops/triton/launch.py: launches through the kept compiled kernel.

On the CPU, with a stand-in JIT kernel: a second launch with the same key calls the compiled kernel with every
argument in signature order and the grid padded to three dimensions; each argument change that Triton
specialises on compiles again, and the changes it does not specialise on do not. Against Triton's own
specialisation (native_specialize_impl, its C++ key of one argument) over awkward values: two values that
share our key always share Triton's. On a CUDA device: the decoding launchers give bitwise the results of
Triton's own launch path over caches of 1 to 4,097 keys, dtypes and misaligned key and value views.
"""

import os

import pytest
import torch

pytest.importorskip("triton")
from asentmax.ops.triton.launch import CachedKernel, _specialisation, cached_launch  # noqa: E402

on_cuda = pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                             reason="needs a CUDA device (and no TRITON_INTERPRET)")


class FakeCompiled:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("compiled", grid, args))


class FakeJIT:
    """Stands in for a triton.jit kernel with parameters X, n, scale, B (constexpr)."""
    fn = None
    arg_names = ["X", "n", "scale", "B"]

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.log)
        return launch


def launched(variant):
    """The log of a first launch, then `variant`'s (args, kwargs, device) launch."""
    device = [0]
    kernel = FakeJIT()
    cached = CachedKernel(kernel, current_device=lambda: device[0])
    x = torch.zeros(64)
    cached[(4,)](x, 17, 0.5, B=64, num_warps=4)
    args, kwargs, device[0] = variant(x)
    cached[(4, 2)](*args, **kwargs)
    return kernel.log


def test_second_launch_takes_the_compiled_kernel():
    log = launched(lambda x: ((x, 18, 0.25), dict(B=64, num_warps=4), 0))
    assert [entry[0] for entry in log] == ["jit", "compiled"]
    _, grid, args = log[1]
    assert grid == (4, 2, 1)
    assert args[1:] == (18, 0.25, 64) and args[0].data_ptr() == log[0][2][0].data_ptr()


@pytest.mark.parametrize("variant", [
    lambda x: ((x[1:], 17, 0.5), dict(B=64, num_warps=4), 0),           # 4-byte offset: not 16-aligned
    lambda x: ((x.double(), 17, 0.5), dict(B=64, num_warps=4), 0),      # dtype
    lambda x: ((x, 1, 0.5), dict(B=64, num_warps=4), 0),                # an int of 1 (Triton: a constant)
    lambda x: ((x, 32, 0.5), dict(B=64, num_warps=4), 0),               # a multiple of 16
    lambda x: ((x, 2**31 + 1, 0.5), dict(B=64, num_warps=4), 0),        # int64
    lambda x: ((x, 17, 0.5), dict(B=32, num_warps=4), 0),               # a constexpr
    lambda x: ((x, 17, 0.5), dict(B=64, num_warps=8), 0),               # a launch option
    lambda x: ((x, 17, 0.5), dict(B=64, num_warps=4), 1),               # the device
    lambda x: ((x, 17, None), dict(B=64, num_warps=4), 0),              # None
], ids=["misaligned", "dtype", "one", "multiple-of-16", "int64", "constexpr", "num_warps", "device", "none"])
def test_each_specialised_change_compiles_again(variant):
    assert [entry[0] for entry in launched(variant)] == ["jit", "jit"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the key without a CUDA device")
def test_without_cuda_the_launch_goes_through_tritons_path():
    """No CUDA device (the CPU machines that compile the kernels with a recorder in place of Triton's
    launch): the device part of the key is None, not an error, and every launch reaches the kernel."""
    kernel = FakeJIT()
    cached = CachedKernel(kernel)
    cached[(1,)](torch.zeros(4), 5, 0.5, B=16)
    cached[(1,)](torch.zeros(4), 5, 0.5, B=16)
    assert [entry[0] for entry in kernel.log] == ["jit", "compiled"]
    assert [key[0] for key in cached.compiled] == [None]


def test_interpreted_kernels_are_left_alone():
    kernel = FakeJIT()
    assert cached_launch(kernel) is kernel


AWKWARD_INTS = [0, 1, 2, 15, 16, 17, 31, 32, 48, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
                -(2**31), -(2**31) - 1, -(2**31) - 16, 2**63 - 16, 2**63 - 1, 2**63, 2**63 + 16, 2**64 - 1]


def awkward_values():
    buffer = torch.zeros(64, dtype=torch.float32)
    tensors = [buffer[i:] for i in range(8)] + [buffer.double(), buffer.half()[3:], buffer.to(torch.bfloat16)]
    return AWKWARD_INTS + [0.0, 1.0, 16.0, -2.5, True, False, None] + tensors


def test_our_key_is_at_least_as_fine_as_tritons():
    """Values that share _specialisation share Triton's own key (native_specialize_impl with specialising
    and alignment on, the finest it has)."""
    libtriton = pytest.importorskip("triton._C.libtriton")
    from triton.backends.compiler import BaseBackend

    def tritons(value):
        key = libtriton.native_specialize_impl(BaseBackend, value, False, True, True)
        return tuple(str(part) for part in key)

    values = awkward_values()
    for a in values:
        for b in values:
            if _specialisation(a) == _specialisation(b):
                assert tritons(a) == tritons(b), (a, b)


@pytest.mark.gpu
@on_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cached_launches_match_tritons_gpu(dtype, monkeypatch):
    """Decoding through the kept compiled kernels (short and split paths, grouped, ALiBi and q_scale, key and
    value views 2 elements off alignment every other call) equals Triton's own launches bitwise, at caches of
    1 to 4,097 keys called in turn, so that later calls reuse kernels compiled for earlier lengths; a second
    sweep of the same calls on new tensors (other data pointers, the same alignments) adds no compiled
    kernel: the key holds no data pointer or length, only what Triton specialises on."""
    from asentmax.ops.triton import attention_decode, attention_decode_short
    from asentmax.ops.triton.attention_decode import entmax_attention_decode

    torch.manual_seed(0)
    options = dict(mode=1, alpha=1.5, scale=0.125, causal=True, tol=3e-2 if dtype != torch.float32 else 1e-3,
                   max_iter=40)
    kernels = [(attention_decode_short, "_decode_short")] + [
        (attention_decode, name) for name in ("_decode_scores", "_decode_threshold", "_decode_output")]
    lengths = [1, 15, 16, 17, 1000, 1024, 2048, 2049, 3000, 4096, 4097, 17, 2049]
    for sweep in range(2):  # the second sweep over the same kinds of calls compiles nothing new
        if sweep == 1:
            kept = {name: len(getattr(module, name).compiled) for module, name in kernels}
        for call, n_k in enumerate(lengths):
            batch, heads, kv_heads, n_q, dim = 2, 8, 2, 1 + call % 3, 64
            q = torch.randn(batch, heads, n_q, dim, device="cuda", dtype=dtype)
            offset = 2 * (call % 2)
            storage = torch.randn(2, batch, kv_heads, n_k, dim + offset, device="cuda", dtype=dtype)
            k, v = storage[0, ..., offset:], storage[1, ..., offset:]
            slopes = torch.rand(batch, heads, device="cuda")
            slopes[:, ::2] = 0.0
            q_scale = 1.0 + torch.rand(batch, heads, n_q, device="cuda")
            with torch.no_grad():
                cached = entmax_attention_decode(q, k, v, slopes=slopes, q_scale=q_scale, kpm=None, **options)
                with monkeypatch.context() as patch:
                    for module, name in kernels:
                        patch.setattr(module, name, getattr(module, name).kernel)
                    expected = entmax_attention_decode(q, k, v, slopes=slopes, q_scale=q_scale, kpm=None,
                                                       **options)
            for got, want in zip(cached, expected, strict=True):
                assert torch.equal(got, want), (n_k, n_q, dtype)
    assert {name: len(getattr(module, name).compiled) for module, name in kernels} == kept
