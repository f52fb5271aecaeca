#!/usr/bin/env bash
# Issue 15's next device calls (results/paper/mqmtar.md, "What to run next"), to be chained while the machine
# is warm (each needs the one before it's runs/plan):
#   bash benchmarks/issue15_gpu_call.sh base     # 10 minutes on one H200:
#     the MQMTAR preset (seed 1, plan run mqmtar_asentmax_preset) trained in device_plan.py's 560-second
#     window, beside the GPU test of `asentmax train --deterministic true` (tests/test_deterministic.py);
#   bash benchmarks/issue15_gpu_call.sh phases   # about 9.5 minutes:
#     the preset's three evaluations beside three second phases from its weights (8,000 steps at lr 2e-5:
#     without look-alikes, the same-base control; with planted look-alikes of every kind; with value
#     look-alikes only, `--lookalike-kinds value`), their evaluations, then the base's weights packed into
#     $OUT (benchmarks/carry_checkpoint.py: 3 parts of 15 MB and a hash, to start later second phases
#     without retraining);
#   bash benchmarks/issue15_gpu_call.sh after    # about 4 minutes, if the session has the time (chained at
#     once: it reads phases' checkpoints): benchmarks/mqmtar_errors.py on the base and the three second phases
#     at 1x with a value look-alike planted in every test sample (`--lookalikes 1 --lookalike-kinds value`:
#     does the model tell the key from its word written as a value?), then the preset's first 2,000 steps
#     with and without --deterministic true side by side, alone on the GPU (their steps per second: the
#     flag's cost).
# The small outputs of a call (device_plan's log and status, the run directories without checkpoints, the
# test's log) go into ONE file, $OUT/issue15_<part>.tgz. Environment: OUT (default ./issue15_call_out), PLAN
# (default benchmarks/plans/issue15_b128.json; a plan with the same run names and tiny flags dry-runs this on
# the CPU).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-issue15_call_out}
plan=${PLAN:-benchmarks/plans/issue15_b128.json}
part=${1:?base, phases or after}
mkdir -p "$out" runs/plan runs/speed
plan_call() {  # plan_call LOG ARGS...: device_plan.py on $plan, its output also in runs/plan/LOG
  local log=$1
  shift
  python benchmarks/device_plan.py "$plan" "$@" 2>&1 | tee -a "runs/plan/$log"
}
case $part in
  base)
    timeout 400 python -m pytest -q -m gpu tests/test_deterministic.py -rfE > runs/plan/deterministic_test.log \
      2>&1 &
    plan_call call_base.log --work runs/plan --seconds 560 --runs mqmtar_asentmax_preset
    wait ;;
  phases)
    plan_call call_phases.log --work runs/plan --seconds 540 --continuing --runs mqmtar_asentmax_preset \
      mqmtar_asentmax_preset_then_lr2e-5 mqmtar_asentmax_preset_then_lookalikes0.1 \
      mqmtar_asentmax_preset_then_value_lookalikes0.1
    python benchmarks/carry_checkpoint.py pack runs/plan/mqmtar_asentmax_preset "$out" 2>&1 \
      | tee -a runs/plan/call_phases.log ;;
  after)
    for run in mqmtar_asentmax_preset mqmtar_asentmax_preset_then_lr2e-5 \
        mqmtar_asentmax_preset_then_lookalikes0.1 mqmtar_asentmax_preset_then_value_lookalikes0.1; do
      timeout 60 python benchmarks/mqmtar_errors.py "runs/plan/$run" --samples 200 --lookalikes 1 \
        --lookalike-kinds value --out "runs/plan/$run/value_lookalike_probe" 2>&1 | tail -n 2 \
        | tee -a runs/plan/call_after.log
    done
    plan_call call_speed.log --work runs/speed --seconds 130 --runs mqmtar_asentmax_speed_deterministic \
      mqmtar_asentmax_speed_default ;;
  *) echo "unknown part $part: base, phases or after" >&2; exit 2 ;;
esac
tar -czf "$out/issue15_$part.tgz" --exclude="*.pt" --exclude=.compile_cache runs/plan runs/speed
echo "wrote $out/issue15_$part.tgz"
