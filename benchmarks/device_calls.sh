#!/usr/bin/env bash
# One device call of issue 15's plan (benchmarks/plans/issue15_b128.json), as results/session*_gpu/README.md
# give them; chain the calls while the machine is warm, since runs/plan lives only on it:
#   OUT=$OUT bash benchmarks/device_calls.sh plan SECONDS RUN... [--continuing]
#     device_plan.py with the named runs side by side for SECONDS (runs a stall check stopped stay stopped)
#   OUT=$OUT bash benchmarks/device_calls.sh eval RUN...
#     `asentmax eval` (300 samples a length) of runs a stall check stopped: their last checkpoint, whose
#     eval.json record_runs.py keeps as eval_at_stall.json
#   OUT=$OUT bash benchmarks/device_calls.sh pack RUN...
#     carry_checkpoint.py pack of finished runs into $OUT (two 15 MB parts each), for reading heads on the CPU
# Each part ends by putting runs/plan without weights into $OUT/plan.tgz (record_runs.py's --work).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
part=${1:?plan, eval or pack}
shift
case $part in
plan)
    seconds=${1:?SECONDS}
    shift
    python benchmarks/device_plan.py benchmarks/plans/issue15_b128.json --work runs/plan \
        --seconds "$seconds" --runs "$@" > "$OUT/device_plan.log" 2>&1
    tail -14 "$OUT/device_plan.log"
    # each evaluated run's exact match per length, to choose the next call while the machine is warm
    for run in "$@"; do
        for table in runs/plan/"$run"/eval*.md; do
            [ -f "$table" ] && echo "$run $(basename "$table" .md): $(awk -F'|' \
                '/^\| [0-9]+ \| [0-9.]+x \|/ {gsub(/ /, "", $3); gsub(/ /, "", $4); printf "%s %s  ", $3, $4}' "$table")"
        done
    done
    ;;
eval)
    for run in "$@"; do
        command=(asentmax eval "runs/plan/$run" --no-progress --samples 300 --batch-size 128
                 --max-batch-tokens 131072)
        { echo "\$ ${command[*]}"; timeout 200 python -m "${command[@]}"; } > "runs/plan/$run.eval.log" 2>&1
        tail -3 "runs/plan/$run.eval.log"
    done
    ;;
pack)
    for run in "$@"; do
        python benchmarks/carry_checkpoint.py pack "runs/plan/$run" "$OUT" --part-mb 15
    done
    ls -la "$OUT"
    ;;
*)
    echo "part must be plan, eval or pack" >&2; exit 2
    ;;
esac
tar czf "$OUT/plan.tgz" --exclude='*.pt' --exclude=tensorboard --exclude=.compile_cache runs/plan
# a timed-out step's children must not outlive the call; patterns that cannot match this shell's command line
pkill -f -- "-m asentmax (train|eval)"; pkill -x nvidia-smi; true
