"""Shared pytest fixtures and helpers."""

import importlib.util
import time
from pathlib import Path

import pytest
import torch


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
