#!/bin/bash
# Ninth session, issue 15 block: MQMTAR runs side by side (train, resuming from the checkpoint where a run has
# one, then eval with 100 test samples per length), stopping cleanly LIMIT seconds after the start.
export PYTHONPATH=src ASENTMAX_GIT_COMMIT=${COMMIT:-unknown}
END=$((SECONDS + ${LIMIT:-540}))
W=runs/p9; mkdir -p $W
PAPER="--norm-placement sandwich --mlp geglu --scale-embeddings true --scaled-residual-init false --tie-embeddings false --norm-eps 1e-6 --asentmax-init normal --zero-embedding-id 4 --layout stretches"
declare -A FLAGS=([ssmax_b512]="--attention ssmax" [asentmax_b512_paper_setup]="--attention asentmax $PAPER"
                  [softmax_b512_paper_setup]="--attention softmax $PAPER")
one() { name=$1; d=$W/$name
  if [ ! -f $W/$name.trained ]; then
    if [ -f $d/checkpoint.pt ]; then args="--resume"; else args="--preset mqmtar --seed 1 ${FLAGS[$name]} $EXTRA"; fi
    timeout -s TERM $((END - SECONDS - 25)) python -m asentmax train $args --run-dir $d --no-progress >> $W/$name.log 2>&1
    rc=$?; echo "$name train rc=$rc at $SECONDS s" >> $OUT/status.txt
    [ $rc = 0 ] && touch $W/$name.trained
  fi
  if [ -f $W/$name.trained ] && [ $((END - SECONDS)) -gt 20 ]; then
    timeout -s TERM $((END - SECONDS - 5)) python -m asentmax eval $d --samples 100 --no-progress >> $W/$name.eval.log 2>&1
    echo "$name eval rc=$? at $SECONDS s" >> $OUT/status.txt
  fi
}
if [ -n "$TESTS" ]; then
  (timeout 400 python -m pytest -q -p no:cacheprovider -n 2 -m gpu -rA $TESTS > $OUT/gpu_tests.log 2>&1; echo "rc=$? at $SECONDS s" >> $OUT/gpu_tests.log) &
fi
for name in ${RUNS:-ssmax_b512 asentmax_b512_paper_setup softmax_b512_paper_setup}; do one $name & done
wait
cat $OUT/status.txt
for f in $W/*.log; do echo "== $f"; grep -v "^\s*$" $f | tail -4 | cut -c1-300; done
tar czf $OUT/runs_p9.tgz --exclude='*.pt' $W
