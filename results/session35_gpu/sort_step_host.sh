#!/usr/bin/env bash
# Where a Sort training step's 5.8 ms go (the 120,000-step run's median ms/step, log.csv): the GPU's busy share
# of the step, and the host's Python time per call. Three runs of the plan's Sort ASEntmax recipe, one after the
# other, each STEPS (3,000) steps (warm-up 300, no validation, no checkpoint): (1) plain, with nvidia-smi's utilisation
# sampled every 200 ms for 8 s of its steady state; (2) under cProfile (slower; its shares are what counts);
# (3) softmax, plain, for the same utilisation sample.
# Usage (device, repo root): OUT=... bash results/session35_gpu/sort_step_host.sh
set -u
plan=benchmarks/plans/issue15_b128.json
flags() { python -c "import json, sys; print(json.load(open('$plan'))['runs'][sys.argv[1]]['train'])" "$1"; }
steps=${STEPS:-3000}  # STEPS=30 tries the script on a CPU (nvidia-smi then writes nothing)
short="--steps $steps --warmup-steps $((steps / 10)) --val-every 0 --checkpoint-every 0 --log-every $((steps / 30))
    --no-progress --overwrite"
sample_gpu() {  # $1: name; waits (at most 240 s) for the run's log to pass a third of its steps, then samples 8 s
    for _ in $(seq 240); do
        [ "$(tail -1 runs/host/$1/log.csv 2>/dev/null | cut -d, -f1)" -ge $((steps / 3)) ] 2>/dev/null && break
        sleep 1
    done
    timeout 8 nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/util_$1.txt"
}
for attention in asentmax softmax; do
    recipe=$(flags sort_${attention}_b128_paper_blocks_120k)
    sample_gpu "$attention" &
    python -m asentmax train --run-dir runs/host/$attention $recipe $short > /dev/null 2>&1
    wait
    if [ "$attention" = asentmax ]; then
        python -m cProfile -o runs/host/sort_step.prof -m asentmax train --run-dir runs/host/asentmax_profiled \
            $recipe $short > /dev/null 2>&1
        python -c "import pstats; s = pstats.Stats('runs/host/sort_step.prof'); s.sort_stats('tottime').print_stats(45); s.sort_stats('cumulative').print_stats(45)" > "$OUT/sort_step_profile.txt"
    fi
done
for run in asentmax softmax asentmax_profiled; do
    python - "$run" "$steps" <<'PY' >> "$OUT/sort_step_host.txt"
import csv, statistics, sys
run = sys.argv[1]
rows = list(csv.DictReader(open(f"runs/host/{run}/log.csv")))
steady = [(int(r["step"]), float(r["elapsed_s"])) for r in rows if int(r["step"]) >= int(sys.argv[2]) // 3]
ms = [(b[1] - a[1]) / (b[0] - a[0]) * 1e3 for a, b in zip(steady, steady[1:])]
print(f"{run}: median {statistics.median(ms):.2f} ms/step over {len(ms)} log windows from step {steady[0][0]} "
      f"(range {min(ms):.2f}-{max(ms):.2f})")
PY
done
for f in "$OUT"/util_*.txt; do
    echo "$f: GPU utilisation % median $(sort -n "$f" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') over $(wc -l < "$f") samples" >> "$OUT/sort_step_host.txt"
done
cat "$OUT/sort_step_host.txt"
