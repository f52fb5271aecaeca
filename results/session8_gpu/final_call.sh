#!/bin/bash
# Eighth session's last call. Phase 1 (correctness, side by side): the SSMax compile diagnostic and the decoding
# GPU tests of the new split path. Phase 2 (timing, alone): the real `asentmax train` loop for ASEntmax, compiled
# and with --cuda-graphs on, from log.csv (the benchmark's loop said 13.9 ms a step; the committed runs took ~20).
export ASENTMAX_GIT_COMMIT=${COMMIT:-unknown} PYTHONPATH=src
mkdir -p runs/diag
T=$OUT/timing.txt
(timeout ${P1:-110} python benchmarks/diagnose_ssmax_compile.py --jobs 10 --timeout 110 > $OUT/ssmax_diag.log 2>&1; echo "rc=$?" >> $OUT/ssmax_diag.log) &
(timeout ${P1:-110} python -m pytest -v -p no:cacheprovider -n 4 -m gpu tests/test_triton_attention_decode.py > $OUT/decode_gpu_tests.log 2>&1; echo "rc=$?" >> $OUT/decode_gpu_tests.log) &
wait
echo "phase 1 done at $SECONDS s" >> $T
ms() { python - "$1" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/log.csv")))
d = [(float(b["elapsed_s"]) - float(a["elapsed_s"])) / (int(b["step"]) - int(a["step"])) * 1e3
     for a, b in zip(rows, rows[1:]) if int(a["step"]) >= 200]
print(sys.argv[1], "first log s", rows[0]["elapsed_s"], "median ms/step %.2f" % statistics.median(d),
      "min %.2f max %.2f" % (min(d), max(d)), "n", len(d))
print("losses", " ".join(r["loss"] for r in rows[::5]))
PY
}
run() { name=$1; shift; timeout ${LIM:-75} python -m asentmax train --preset mqmtar --attention asentmax --seed 1 --steps ${STEPS:-700} \
  --val-every 0 --checkpoint-every 0 --no-progress --run-dir runs/diag/$name --overwrite "$@" > runs/diag/$name.log 2>&1
  echo "$name rc=$? at $SECONDS s" >> $T; ms runs/diag/$name >> $T 2>&1; grep -v "^\s*$" runs/diag/$name.log | tail -c 6000 > $OUT/$name.log; }
TORCH_LOGS="recompiles,graph_breaks" run cli_default
run cli_graphs --cuda-graphs on
cat $T
