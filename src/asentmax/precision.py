"""The bf16 precision rule every train and evaluation path follows, and its autocast region.

Training (`TrainConfig.amp`: AMP_MODES) and evaluation (`asentmax eval --amp`, `asentmax lm eval`, the lm-eval
model's `amp`: EVAL_AMP_MODES) autocast to bf16 for "bf16", and for "auto" on a CUDA device; "off" and a CPU
under "auto" run in the weights' dtype. Training's "bf16-true" casts the weights themselves (trainer.py) and
opens no autocast region. The fused attention kernels run 18-224x slower on fp32 inputs than on bf16 ones on
an H100 (results/fp32_kernels_sm90.md), which is why "auto" means bf16 on a GPU.
"""

from __future__ import annotations

import torch

AMP_MODES = ("auto", "bf16", "bf16-true", "off")  # TrainConfig.amp: the training precisions
EVAL_AMP_MODES = ("auto", "bf16", "off")  # the evaluation precisions: `asentmax eval --amp`, lm-eval's amp


def autocast_dtype(amp: str, device) -> torch.dtype | None:
    """The dtype a run with precision `amp` (AMP_MODES or EVAL_AMP_MODES) autocasts to on `device`: bf16 for
    "bf16", and for "auto" on a CUDA device; None (no autocast region) otherwise."""
    on_cuda = torch.device(device).type == "cuda"
    return torch.bfloat16 if amp == "bf16" or (amp == "auto" and on_cuda) else None


def autocast(device, dtype: torch.dtype | None):
    """torch.autocast to `dtype` on `device`'s type, or a disabled one when `dtype` is None."""
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype or torch.bfloat16,
                          enabled=dtype is not None)
