#!/usr/bin/env bash
# Inductor's mm padding (pad_mm) and the compiled training step (results/session40_gpu/README.md), on the Reverse
# ASEntmax plan recipe (8 heads: a 4-output temperature projection), each arm with its own Inductor cache:
#   OUT=$OUT bash benchmarks/shape_padding_check.sh crash STEPS
#     two arms side by side, both with torch._inductor.config.force_shape_pad on, so that pad_mm pads every mm it
#     is allowed to (otherwise it pads where timing both versions on the GPU favours padding):
#       forced      Inductor's settings as asentmax train leaves them
#       forced_off  the same with TORCHINDUCTOR_SHAPE_PADDING=0 (pad_mm off, whatever force_shape_pad says)
#     Before the trainer turned pad_mm off itself (asentmax.trainer.INDUCTOR_OPTIONS), `forced` failed
#     `assert_size_stride` in its third step's backward and `forced_off` trained; now both should train.
#   OUT=$OUT bash benchmarks/shape_padding_check.sh speed STEPS
#     what turning pad_mm off costs: the arms one after the other, alone on the GPU, each printing its ms a step
#     from step 1,000 to the last (after the compiles and CUDA graph recordings):
#       padding     INDUCTOR_OPTIONS emptied: pad_mm pads where it times padding faster (the trainer before)
#       no_padding  the trainer as it is
# Each arm's log is $OUT/<arm>.log; the last lines say how each ended.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
part=${1:?crash or speed}
steps=${2:?STEPS}
work=runs/shape_padding_check
rm -rf "$work"
mkdir -p "$work"
train=(train --no-progress --preset reverse --attention asentmax --batch-size 128 --steps "$steps"
       --warmup-steps 2000 --min-lr-ratio 0 --val-every 100000 --checkpoint-every 100000
       --norm-placement sandwich --mlp geglu --scale-embeddings true --scaled-residual-init false
       --tie-embeddings false --norm-eps 1e-6 --asentmax-init normal --val-multipliers 1 --val-samples 8
       --seed 8 --data-seed 1)
run_arm() {  # ARM PYTHON_SETUP LOG_EVERY ENV...: train with PYTHON_SETUP run before asentmax's main
    local arm=$1 setup=$2 log_every=$3
    shift 3
    env "$@" TORCHINDUCTOR_CACHE_DIR="$work/cache_$arm" python -c "import sys; $setup
from asentmax.cli import main; sys.exit(main(sys.argv[1:]))" "${train[@]}" --log-every "$log_every" \
        --run-dir "$work/$arm" > "$OUT/$arm.log" 2>&1
    echo "$arm: exit $? after $(tail -1 "$work/$arm/log.csv" 2>/dev/null | cut -d, -f1) steps;" \
        "$(grep -m1 AssertionError "$OUT/$arm.log")"
}
step_ms() {  # ARM: ms a step from step 1,000 to the last, from log.csv's elapsed_s
    awk -F, -v arm="$1" '$1 == 1000 {t0 = $6} NR > 1 {s = $1; t = $6}
        END {if (t0 != "") printf "%s: %.2f ms a step over steps 1000-%d\n", arm, 1000 * (t - t0) / (s - 1000), s}' \
        "$work/$1/log.csv"
}
case $part in
crash)
    forced='import torch._inductor.config as c; c.force_shape_pad = True'
    run_arm forced "$forced" 1 TORCHINDUCTOR_SHAPE_PADDING=1 &
    run_arm forced_off "$forced" 1 TORCHINDUCTOR_SHAPE_PADDING=0 &
    wait
    ;;
speed)
    run_arm padding 'import asentmax.trainer as t; t.INDUCTOR_OPTIONS = {}' 500 TORCHINDUCTOR_SHAPE_PADDING=1
    run_arm no_padding 'pass' 500 TORCHINDUCTOR_SHAPE_PADDING=1
    step_ms padding
    step_ms no_padding
    ;;
*)
    echo "part must be crash or speed" >&2; exit 2
    ;;
esac
