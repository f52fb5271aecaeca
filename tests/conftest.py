"""Shared pytest fixtures and helpers, and (under TRITON_INTERPRET=1) a faster Triton interpreter launch."""

import importlib.util
import os
import time
from pathlib import Path

import pytest
import torch


def _patch_the_language_once_per_launch():
    """Under TRITON_INTERPRET=1, the interpreter (triton 3.x, runtime/interpreter.py) patches the
    triton.language modules a kernel sees at each launch (restored when the launch ends) and again at every
    call of a @triton.jit helper inside it (tl.sum, the kernels' own helpers): each time _patch_builtin walks
    the modules with inspect.getmembers, most of the interpreter's time in the fused attention kernels. A
    helper's patch is never restored, so once a module is patched in a launch, patching it again there is a
    no-op (its builtins are already replaced; the other attributes are set again to equivalent functions).
    Here a helper call skips it when every language module it sees was patched earlier in the same launch:
    the kernels run exactly as before."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton import language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "GridExecutor")):
        return
    patch_lang, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    launches = []  # per running launch: the ids of the language modules patched in it so far

    def languages(fn):  # the modules interpreter._patch_lang patches for fn
        return {id(value) for value in fn.__globals__.values() if value is tl or value is tl.core}

    def patch_lang_once(fn):
        seen = languages(fn)
        if launches and seen and seen <= launches[-1]:
            return interpreter._LangPatchScope()
        scope = patch_lang(fn)
        if launches:
            launches[-1] |= seen
        return scope

    def launch_once(self, *args, **kwargs):
        launches.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            launches.pop()

    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch_once


_patch_the_language_once_per_launch()


@pytest.fixture
def one_thread():
    """Tiny models run fastest (and least disturbed by a shared machine) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def load_benchmark(name: str):
    """benchmarks/<name>.py imported as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def join_workers(workers, seconds=300):
    """Wait for torch.multiprocessing workers (join=False); kill them and fail the test after `seconds`."""
    deadline = time.monotonic() + seconds
    while not workers.join(timeout=5):
        if time.monotonic() > deadline:
            for process in workers.processes:
                process.kill()
            pytest.fail(f"workers did not finish within {seconds} s")


def randomize_temperatures(model):
    """Nonzero ASEntmax / SSMax temperature parameters (they start at zero), so that tests exercise them."""
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.temperature is not None:
                for p in block.attn.temperature.parameters():
                    p.copy_(0.3 * torch.randn_like(p).abs())


def left_padded(lengths, total, vocab, seed=1, device="cpu"):
    """(ids, attention mask, position_ids) for rows of the given real lengths, padded on the left (pad id 0,
    real ids in 1..vocab-1), on `device`."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, total - n:] = 1
        ids[row, :total - n] = 0
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    return ids.to(device), mask.to(device), positions.to(device)


class nan_poisoned_empty:
    """Within the block, torch.empty returns NaN-filled (integer: -1-filled) tensors."""

    def __enter__(self):
        self.empty = torch.empty

        def poisoned(*args, **kwargs):
            x = self.empty(*args, **kwargs)
            return x.fill_(float("nan") if x.is_floating_point() else -1)

        torch.empty = poisoned

    def __exit__(self, *exc):
        torch.empty = self.empty
