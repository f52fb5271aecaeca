"""benchmarks/bench_attention_gpu.py --dtypes table: every (backend, dtype) case of a shape gets a line
whose "x bf16" cells divide its times by the triton bf16 times of that same shape (not another shape's), a
case a row lacks shows '-', and the errors a row recorded are listed under the table."""

import pytest

from conftest import load_benchmark


def test_dtypes_table_divides_by_the_same_shapes_bf16():
    pytest.importorskip("triton")
    bench = load_benchmark("bench_attention_gpu")
    short = {"B": 2, "H": 16, "D": 64, "N": 1024, "triton_bfloat16_fwd_ms": 2.0,
             "triton_bfloat16_fwdbwd_ms": 4.0, "triton_float32_fwd_ms": 7.0, "triton_float32_fwdbwd_ms": 12.0,
             "triton_float32_first_call_s": 31.5, "chunked_float32_fwd_ms": 3.0,
             "chunked_float32_fwdbwd_TFLOPs": 0.25}
    long = {"B": 2, "H": 16, "D": 64, "N": 4096, "triton_bfloat16_fwd_ms": 10.0,
            "triton_bfloat16_fwdbwd_ms": 5.0, "triton_float32_fwd_ms": 30.0, "triton_float32_fwdbwd_ms": 45.0,
            "chunked_bfloat16_error": "out of memory"}
    report = {"info": {"gpu": "GPU", "torch": "t", "triton": "t", "command": "cmd"}, "attention": [],
              "decode": [], "first_call": [], "short": [], "dtypes": [short, long]}
    lines = bench.markdown(report).splitlines()
    rows = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 13 and cells[3].isdigit():
            rows[(int(cells[3]), cells[4], cells[5])] = cells[6:]
    assert len(rows) == 2 * len(bench.DTYPE_CASES)
    # fwd ms, fwd+bwd ms, x bf16 fwd, x bf16 f+b, TFLOP/s, peak MB, first call s
    assert rows[(1024, "triton", "float32")] == ["7", "12", "3.5", "3", "-", "-", "31.5"]
    assert rows[(4096, "triton", "float32")] == ["30", "45", "3", "9", "-", "-", "-"]
    assert rows[(1024, "chunked", "float32")] == ["3", "-", "1.5", "-", "0.25", "-", "-"]
    assert rows[(1024, "triton", "bfloat16")][2:4] == ["1", "1"]
    assert rows[(4096, "triton", "float16")] == ["-"] * 7
    assert "- D=64 N=4096 chunked_bfloat16_error: out of memory" in lines
