#!/usr/bin/env bash
# Does Inductor's shared compile cache crash two runs of one model started side by side (thirty-fourth session's
# `assert_size_stride` in the compiled backward)? Two Sort ASEntmax runs (seeds 2 and 3, the plan's 120,000-step
# recipe) share one TORCHINDUCTOR_CACHE_DIR, two more each have their own, all four at once on a fresh machine,
# each stopped with SIGINT after SECONDS (the crash came 49 s in, at the first backward).
# Usage (device, repo root): OUT=... bash results/session35_gpu/cache_ab.sh [SECONDS]
set -u
seconds=${1:-110}
plan=benchmarks/plans/issue15_b128.json
flags() { python -c "import json, sys; print(json.load(open('$plan'))['runs'][sys.argv[1]]['train'])" "$1"; }
for seed in 2 3; do
    recipe=$(flags sort_asentmax_b128_paper_blocks_120k_seed$seed)
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_ab_shared timeout -s INT "$seconds" python -m asentmax train \
        --run-dir runs/cache_ab/shared_seed$seed --no-progress $recipe > "$OUT/ab_shared_seed$seed.log" 2>&1 &
    TORCHINDUCTOR_CACHE_DIR=/tmp/cache_ab_own_$seed timeout -s INT "$seconds" python -m asentmax train \
        --run-dir runs/cache_ab/own_seed$seed --no-progress $recipe > "$OUT/ab_own_seed$seed.log" 2>&1 &
done
wait
for log in "$OUT"/ab_*.log; do
    echo "== $log: $(grep -c assert_size_stride "$log") assertion lines; last step $(tail -1 runs/cache_ab/$(basename "$log" .log | sed 's/^ab_//')/log.csv 2>/dev/null | cut -d, -f1)"
done
