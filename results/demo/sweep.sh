#!/usr/bin/env bash
# Demo config search (how results/demo was chosen): train softmax and ASEntmax on candidate
# (task, lengths, positions) settings, one thread per run, all runs in parallel, then eval at MULT
# (default 1x-16x).
# Usage: PY=python OUT=/tmp/sweep MULT="1 2 4 8 16" METHODS="softmax asentmax" results/demo/sweep.sh \
#     "name|train flags" ...
set -u
PY=${PY:-.venv/bin/python}; OUT=${OUT:-/tmp/sweep}; MULT=${MULT:-1 2 4 8 16}
METHODS=${METHODS:-softmax asentmax}; mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=src
one() {  # name method flags...
  local name=$1 method=$2; shift 2
  local dir="$OUT/${name}_$method" t0=$(date +%s)
  $PY -m asentmax train --run-dir "$dir" --overwrite --no-progress --attention "$method" "$@" >"$dir.log" 2>&1 \
    && t1=$(date +%s) && $PY -m asentmax eval "$dir" --multipliers $MULT --samples 100 --no-progress >>"$dir.log" 2>&1
  echo "$name $method train_s=$((t1 - t0)) total_s=$(( $(date +%s) - t0 ))" >>"$dir.log"
}
for spec in "$@"; do
  name=${spec%%|*}; flags=${spec#*|}
  for method in $METHODS; do one "$name" "$method" $flags & done
done
wait
for f in "$OUT"/*.log; do echo "== $f"; grep -E "exact match|EM|train_s|Error|error" "$f"; done
