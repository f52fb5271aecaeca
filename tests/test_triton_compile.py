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
