#!/bin/bash
# Tenth session, issue 15: MQMTAR runs side by side (train, resuming from the checkpoint where a run has one,
# then eval with 100 test samples per length: the last checkpoint, and best.pt where the run keeps one),
# stopping cleanly LIMIT seconds after the start.
export PYTHONPATH=src ASENTMAX_GIT_COMMIT=${COMMIT:-unknown}
END=$((SECONDS + ${LIMIT:-540}))
W=runs/p10; mkdir -p $W
BLOCKS="--norm-placement sandwich --mlp geglu --scale-embeddings true --scaled-residual-init false --tie-embeddings false --norm-eps 1e-6 --zero-embedding-id 4 --layout stretches"
B128="--batch-size 128 --steps 64000 --warmup-steps 3200 --min-lr-ratio 0 --val-every 3200 --checkpoint-every 1600 --val-multipliers 1 4 16 --val-samples 128 --keep-best-at 16"
declare -A FLAGS=([asentmax_b128_64k]="--attention asentmax $B128" [asentmax_b128_64k_seed3]="--attention asentmax $B128 --seed 3" [softmax_b128_64k]="--attention softmax $B128"
                  [asentmax_b512_paper_blocks]="--attention asentmax $BLOCKS"
                  [ssmax_b512_plain]="--attention ssmax --ssmax-form plain --ssmax-s-init 1")
one() { name=$1; d=$W/$name
  if [ ! -f $W/$name.trained ]; then
    if [ -f $d/checkpoint.pt ]; then args="--resume"; else args="--preset mqmtar --seed 1 ${FLAGS[$name]} $EXTRA"; fi
    timeout -s TERM $((END - SECONDS - 25)) python -m asentmax train $args --run-dir $d --no-progress >> $W/$name.log 2>&1
    rc=$?; echo "$name train rc=$rc at $SECONDS s" >> $OUT/status.txt
    [ $rc = 0 ] && touch $W/$name.trained
  fi
  if [ -f $W/$name.trained ] && [ ! -f $W/$name.evaluated ] && [ $((END - SECONDS)) -gt 20 ]; then
    timeout -s TERM $((END - SECONDS - 5)) python -m asentmax eval $d --samples 100 --no-progress >> $W/$name.eval.log 2>&1
    rc=$?; echo "$name eval rc=$rc at $SECONDS s" >> $OUT/status.txt
    if [ $rc = 0 ] && [ -f $d/best.pt ] && [ $((END - SECONDS)) -gt 20 ]; then
      timeout -s TERM $((END - SECONDS - 5)) python -m asentmax eval $d --checkpoint best --samples 100 --no-progress >> $W/$name.eval.log 2>&1
      rc=$?; echo "$name eval best rc=$rc at $SECONDS s" >> $OUT/status.txt
    fi
    [ $rc = 0 ] && touch $W/$name.evaluated
  fi
}
if [ -n "$TESTS" ]; then
  (timeout 400 python -m pytest -q -p no:cacheprovider -n 2 -m gpu -rA $TESTS > $OUT/gpu_tests.log 2>&1; echo "rc=$? at $SECONDS s" >> $OUT/gpu_tests.log) &
fi
for name in ${RUNS:-asentmax_b128_64k softmax_b128_64k asentmax_b512_paper_blocks}; do one $name & done
wait
cat $OUT/status.txt
for f in $W/*.log; do echo "== $f"; grep -v "^\s*$" $f | tail -3 | cut -c1-300; done
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
tar czf $OUT/runs_p10.tgz --exclude='*.pt' $W
