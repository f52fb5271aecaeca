#!/bin/bash
# Ninth session, call 2: GQA / short-cache decoding against SDPA (alone on the GPU).
export ASENTMAX_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=src
timeout 560 python benchmarks/bench_decode_gpu.py --out $OUT > $OUT/bench_decode.log 2>&1
echo "rc=$? at $SECONDS s" >> $OUT/bench_decode.log
tail -c 6000 $OUT/bench_decode.log
