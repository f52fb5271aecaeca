#!/usr/bin/env bash
# The thirty-seventh session's device calls (results/session37_gpu/README.md), chained while the machine is warm:
#   OUT=$OUT bash results/session37_gpu/calls.sh plan SECONDS [--continuing]
#     the four zero-init Reverse ASEntmax screens side by side (device_plan.py; stalled runs stay stopped),
#     then the run directories without weights into $OUT/plan.tgz
#   OUT=$OUT bash results/session37_gpu/calls.sh eval RUN...
#     `asentmax eval` (300 samples per length) of runs a screen stopped: their heads' theta and support size
#   OUT=$OUT bash results/session37_gpu/calls.sh pack RUN...
#     carry_checkpoint.py pack of finished runs into $OUT (two 15 MB parts each), for reading heads on the CPU
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
SCREENS="reverse_asentmax_b128_paper_blocks_zero_init_seed0_screen reverse_asentmax_b128_paper_blocks_zero_init_seed3_screen
reverse_asentmax_b128_paper_blocks_zero_init_seed7_screen reverse_asentmax_b128_paper_blocks_zero_init_seed8_screen"
EVAL_FLAGS="--samples 300 --batch-size 128 --max-batch-tokens 131072"
part=${1:?plan, eval or pack}
shift
case $part in
plan)
    seconds=${1:?SECONDS}
    shift
    # shellcheck disable=SC2086
    python benchmarks/device_plan.py benchmarks/plans/issue15_b128.json --work runs/plan --seconds "$seconds" \
        --runs $SCREENS "$@" > "$OUT/device_plan.log" 2>&1
    tail -12 "$OUT/device_plan.log"
    ;;
eval)
    for run in "$@"; do
        # shellcheck disable=SC2086
        timeout 200 python -m asentmax eval "runs/plan/$run" $EVAL_FLAGS >> "$OUT/eval_stalled.log" 2>&1
        tail -3 "$OUT/eval_stalled.log"
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
