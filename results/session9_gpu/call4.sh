#!/bin/bash
export PYTHONPATH=src ASENTMAX_GIT_COMMIT=${COMMIT:-unknown}
LIMIT=170 bash runs/device/b.sh > $OUT/b_tail.txt 2>&1
timeout 110 python benchmarks/bench_decode_gpu.py --out $OUT > $OUT/bench_decode.log 2>&1; echo "decode rc=$? at $SECONDS s" >> $OUT/status.txt
timeout $((540 - SECONDS)) python benchmarks/tune_attention_gpu.py --kernels 128 --rep-ms 300 --budget-s $((480 - SECONDS)) --out $OUT/attention_tuning4 > $OUT/tune.log 2>&1; echo "tune rc=$? at $SECONDS s" >> $OUT/status.txt
cat $OUT/status.txt; tail -5 $OUT/tune.log
