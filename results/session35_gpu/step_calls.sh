#!/usr/bin/env bash
# The thirty-sixth session's first two device calls (results/session35_gpu/README.md), chained while warm:
#   OUT=$OUT bash results/session35_gpu/step_calls.sh a   # about 7 minutes, on a FRESH machine (empty caches):
#     cache_ab.sh 120 (the shared compile cache A/B), the GPU tests of StepGraph, and bench_train_gpu.py's bare
#     rows for Sort (softmax, ASEntmax; batch 128; no loop rows: part b times the loop)
#   OUT=$OUT bash results/session35_gpu/step_calls.sh b   # about 7 minutes:
#     sort_step_host.sh (the loop's GPU utilisation and a cProfile), then bench_train_gpu.py's bare rows for
#     the MQMTAR preset's ASEntmax at batch 128
# Every output lands in $OUT (at most 8 files come back: part a writes 7, part b 6).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
part=${1:?a or b}
case $part in
a)
    bash results/session35_gpu/cache_ab.sh 120 > "$OUT/cache_ab.txt" 2>&1
    (cd "$OUT" && tar czf ab_logs.tgz ab_*.log && rm ab_*.log)
    timeout 150 python -m pytest -q -m gpu tests/test_cuda_graphs_gpu.py -k step_graph > "$OUT/step_graph_tests.log" 2>&1
    timeout 290 python benchmarks/bench_train_gpu.py --task sort --normalisers softmax,asentmax --batch-sizes 128 \
        --loop-steps 0 --budget-s 240 --out "$OUT/train_gpu_sort" > "$OUT/train_gpu_sort.log" 2>&1
    tail -3 "$OUT/step_graph_tests.log"; cat "$OUT/cache_ab.txt" "$OUT/train_gpu_sort.md"
    ;;
b)
    STEPS=2000 timeout 280 bash results/session35_gpu/sort_step_host.sh > /dev/null 2>&1
    (cd "$OUT" && tar czf util.tgz util_*.txt && rm util_*.txt)
    timeout 290 python benchmarks/bench_train_gpu.py --task mqmtar --normalisers asentmax --batch-sizes 128 \
        --loop-steps 0 --budget-s 240 --out "$OUT/train_gpu_mqmtar128" > "$OUT/train_gpu_mqmtar128.log" 2>&1
    cat "$OUT/sort_step_host.txt" "$OUT/train_gpu_mqmtar128.md"
    ;;
*)
    echo "part must be a or b" >&2; exit 2
    ;;
esac
# a timed-out script's children must not outlive the call; patterns that cannot match the calling shell's own
# command line (`pkill -f nvidia-smi` did in the thirty-sixth session, and the call came back with rc -1)
pkill -f "^python -m asentmax train"; pkill -x nvidia-smi; true
