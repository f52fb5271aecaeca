"""Shared pytest fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models run fastest (and least disturbed by a shared machine) on one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
