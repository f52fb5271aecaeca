#!/bin/bash
# Ninth session, call 1: GPU tests that unblock the cuda_graphs default, then the training benchmark alone.
export ASENTMAX_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=src
nvidia-smi --query-gpu=name,memory.used --format=csv > $OUT/gpu_tests.log
(timeout 200 python -m pytest -q -p no:cacheprovider -n 3 -m gpu tests/test_cuda_graphs_gpu.py tests/test_compile_gpu.py \
   tests/test_trainer_speed.py -rA >> $OUT/gpu_tests.log 2>&1; echo "rc=$? at $SECONDS s" >> $OUT/gpu_tests.log)
tail -c 3000 $OUT/gpu_tests.log
timeout $((570 - SECONDS)) python benchmarks/bench_train_gpu.py --normalisers softmax,ssmax,entmax,asentmax \
   --batch-sizes 512 --loop-steps 300 --budget-s $((520 - SECONDS)) --out $OUT/train_gpu > $OUT/bench_train.log 2>&1
echo "bench rc=$? at $SECONDS s" >> $OUT/bench_train.log
tail -c 4000 $OUT/bench_train.log
