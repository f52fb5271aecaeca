"""The fused attention kernels compile for Hopper GPUs (sm_90), checked without a GPU.

The interpreter tests run the kernels' logic but never compile them; benchmarks/compile_kernels_sm90.py
compiles every launch the forward, backward and decoding launchers make (head dims 64 and 128) for sm_90.
It runs in a subprocess without TRITON_INTERPRET, which the rest of the suite sets.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not PTXAS.exists(), reason="this triton build has no bundled ptxas")
def test_kernels_compile_for_sm90():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compile_kernels_sm90.py"), "--quick"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "0 failed" in result.stdout


def test_dtype_option_reaches_the_fused_launches():
    """--dtype float32 records the fused attention launches on fp32 inputs (their dots in "ieee"), the
    default on bf16 ("tf32" dots): what results/fp32_kernels_sm90.md compares."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")])
    script = ("import torch, compile_kernels_sm90 as c\n"
              "for dtype in (torch.bfloat16, torch.float32):\n"
              "    launches = c.record_launches((1.5,), (64,), dtype)\n"
              "    fused = {kw['DOT_PRECISION'] for fn, args, kw in launches\n"
              "             if fn.__name__.startswith('_entmax_attention')}\n"
              "    print(dtype, sorted(fused))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["torch.bfloat16 ['tf32']", "torch.float32 ['ieee']"]
