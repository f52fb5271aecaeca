"""Triton launches that reuse the compiled kernel of an earlier launch with the same specialisation.

`kernel[grid](*args, **kwargs)` on a `triton.jit` function binds the arguments, builds Triton's
specialisation key, looks the compiled kernel up and launches it. On the H200 that took 19-26 us of host
time a launch, against 9-10 us for launching the compiled kernel the first call returned, and 15-19 us
through this module (results/decode_host.md, twenty-first session: the three side by side). A decoding step
is one to three launches of a few tens of microseconds of GPU time, so the decoding launchers
(attention_decode.py, attention_decode_short.py) launch through `cached_launch(kernel)`.

It keys the compiled kernels by a key at least as fine as Triton's, so that a launch never reuses a kernel
compiled for other arguments (one compiled kernel may sit under several of our keys, never the reverse):
- the current CUDA device (a compiled kernel is loaded on one);
- each positional argument: a tensor by dtype and whether its data pointer is 16-byte aligned; an int by
  whether it is 1, whether it is a multiple of 16 and its width (int32, int64, wider); a float, bool or None
  by its type (Triton compiles floats as fp32 and never specialises on their value);
- the keyword arguments by value (the constexprs and the launch options such as num_warps).
Triton specialises integers on being 1 or a multiple of 16 only where a kernel does not list them in
do_not_specialize; keying on it always costs at most a few more compilations, never a wrong one.

On the first launch of a key the kernel is launched by Triton as usual and the compiled kernel it returns
is kept; later launches call it directly, with every argument in signature order (the positional ones, then
the keyword ones that are parameters). Constexprs must be passed by keyword, runtime arguments by position
(as the decoding launchers do). Under TRITON_INTERPRET=1 (the CPU interpreter CI uses) triton.jit makes an
interpreted function, which compiles nothing: cached_launch leaves it as it is. Changing Triton's own
options between launches (debug mode, TRITON_* environment variables) is not seen by the cache: restart the
process.
"""

import functools

import torch
from torch import Tensor
from triton.runtime.jit import JITFunction


def _specialisation(arg):
    """The part of the cache key for one positional argument (see the module docstring). Written for speed
    (it runs for every argument of every launch): the common kinds first, no tuple where an int will do."""
    kind = type(arg)
    if kind is Tensor:
        return arg.dtype, not arg.data_ptr() & 15
    if kind is int:
        if arg == 1:
            return 1
        if -2147483648 <= arg <= 2147483647:
            return 32 if arg & 15 else 33  # never 1
        return (64 if -(2**63) <= arg < 2**63 else 128) + (not arg & 15)
    if kind is float or kind is bool or arg is None:
        return kind
    if isinstance(arg, Tensor):  # a subclass
        return arg.dtype, not arg.data_ptr() & 15
    return kind, arg  # anything else (a numpy scalar, say) by its value: finer than Triton, never coarser


def _no_device():
    return None


class CachedKernel:
    """A triton.jit kernel launched as `cached[grid](*runtime_args, **constexprs_and_options)`, through the
    compiled kernel of the first launch with the same key. `current_device` returns the device index for
    the key; by default torch.cuda.current_device (Triton's own choice), or None where torch has no CUDA
    device (decided at the first launch: then only a stand-in for Triton's launch, such as
    benchmarks/compile_kernels_sm90.py's recorder, can run, and it returns no compiled kernel)."""

    def __init__(self, kernel, current_device=None):
        self.kernel = kernel
        self.fn = kernel.fn
        self.arg_names = kernel.arg_names
        self.current_device = current_device or self._first_device
        self.compiled = {}  # key -> (compiled kernel, the keyword arguments in signature order)

    def _first_device(self):
        self.current_device = torch.cuda.current_device if torch.cuda.is_available() else _no_device
        return self.current_device()

    def __getitem__(self, grid):
        return functools.partial(self._launch, grid)

    def _launch(self, grid, *args, **kwargs):
        key = (self.current_device(), tuple(map(_specialisation, args)), tuple(kwargs.items()))
        cached = self.compiled.get(key)
        if cached is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if compiled is not None:
                tail = tuple(kwargs[name] for name in self.arg_names[len(args):])
                self.compiled[key] = compiled, tail
            return
        compiled, tail = cached
        compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *tail)


def cached_launch(kernel):
    """A decorator above @triton.jit: the kernel as a CachedKernel, or unchanged where it is not a compiled
    JIT function (under TRITON_INTERPRET=1 triton.jit makes an interpreted one, which compiles nothing)."""
    return CachedKernel(kernel) if isinstance(kernel, JITFunction) else kernel
