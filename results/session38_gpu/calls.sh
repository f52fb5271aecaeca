#!/usr/bin/env bash
# The thirty-eighth session's device calls (results/session38_gpu/README.md), chained while the machine is warm:
#   OUT=$OUT bash results/session38_gpu/calls.sh plan SECONDS RUN... [--continuing]
#     device_plan.py over issue 15's plan with the named runs side by side (stalled runs stay stopped),
#     then the run directories without weights into $OUT/plan.tgz
#   OUT=$OUT bash results/session38_gpu/calls.sh pack RUN...
#     carry_checkpoint.py pack of finished runs into $OUT (two 15 MB parts each), for reading heads on the CPU
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
part=${1:?plan or pack}
shift
case $part in
plan)
    seconds=${1:?SECONDS}
    shift
    python benchmarks/device_plan.py benchmarks/plans/issue15_b128.json --work runs/plan --seconds "$seconds" \
        --runs "$@" > "$OUT/device_plan.log" 2>&1
    tail -14 "$OUT/device_plan.log"
    ;;
pack)
    for run in "$@"; do
        python benchmarks/carry_checkpoint.py pack "runs/plan/$run" "$OUT" --part-mb 15
    done
    ls -la "$OUT"
    ;;
*)
    echo "part must be plan or pack" >&2; exit 2
    ;;
esac
tar czf "$OUT/plan.tgz" --exclude='*.pt' --exclude=tensorboard --exclude=.compile_cache runs/plan
# a timed-out step's children must not outlive the call; patterns that cannot match this shell's command line
pkill -f -- "-m asentmax (train|eval)"; pkill -x nvidia-smi; true
