"""asentmax/precision.py: the bf16 rule every train and evaluation path follows, and its autocast region."""

import pytest
import torch

from asentmax import precision


@pytest.mark.parametrize("amp", precision.AMP_MODES + precision.EVAL_AMP_MODES)
@pytest.mark.parametrize("device", ["cpu", "cuda", torch.device("cuda", 0)])
def test_autocast_dtype_is_bf16_for_bf16_and_for_auto_on_cuda(amp, device):
    on_cuda = torch.device(device).type == "cuda"
    expected = torch.bfloat16 if amp == "bf16" or (amp == "auto" and on_cuda) else None
    assert precision.autocast_dtype(amp, device) is expected


def test_eval_modes_are_the_train_modes_without_bf16_true():
    assert set(precision.AMP_MODES) - set(precision.EVAL_AMP_MODES) == {"bf16-true"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, None])
def test_autocast_region_casts_matmuls_only_when_given_a_dtype(dtype):
    a, b = torch.randn(3, 4, dtype=torch.float64).float(), torch.randn(4, 5).float()
    with precision.autocast("cpu", dtype):
        out = a @ b
    assert out.dtype == (dtype or torch.float32)
    expected = (a.to(dtype) @ b.to(dtype)) if dtype is not None else a @ b
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
