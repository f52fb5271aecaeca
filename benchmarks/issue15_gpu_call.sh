#!/usr/bin/env bash
# Issue 15's next device calls (results/paper/mqmtar.md, "What to run next"), to be chained while the machine
# is warm (each needs the one before it's runs/plan):
#   bash benchmarks/issue15_gpu_call.sh base     # 10 minutes on one H100 or H200:
#     the MQMTAR preset (seed 1, plan run mqmtar_asentmax_preset) trained in device_plan.py's 560-second
#     window, alone on the GPU, with the two stall checks (steps 7,000 and 19,200: results/paper/mqmtar.md).
#     A base that one of them stops (the second plateau, as the fifty-first session's rerun4, which never
#     solved the task at 1x, would have been at step 19,200) is set aside as mqmtar_asentmax_preset_stalled1
#     and trained again from step 0 with the same seed (the GPU's summation order makes each attempt another
#     draw: seed 1's five runs ended at 0-80 % at 1,024x) in the window's rest, up to BASE_ATTEMPTS (2)
#     attempts; an attempt the window cuts is continued by phases;
#   bash benchmarks/issue15_gpu_call.sh phases   # about 9.5 minutes (nothing, if the base was stopped):
#     the rest of the base and its three evaluations beside three second phases from its weights (8,000
#     steps at lr 2e-5: without look-alikes, the same-base control; with planted look-alikes of every kind;
#     with value look-alikes only, `--lookalike-kinds value`), their evaluations, then the base's weights
#     packed into $OUT (benchmarks/carry_checkpoint.py: 3 parts of 15 MB and a hash, to start later second
#     phases without retraining: repacked here with --bf16-linear, 21.9 MB, it fits a call's carry);
#   bash benchmarks/issue15_gpu_call.sh after    # 4-10 minutes, if the session has the time (chained at
#     once: it reads phases' checkpoints): benchmarks/mqmtar_errors.py on the base and the three second phases
#     with a value look-alike planted in every test sample (`--lookalikes 1 --lookalike-kinds value`: does the
#     model tell the key from its word written as a value?) at 1x, 256x and 1,024x (PROBE_MULTIPLIERS; 100
#     samples each, at most 120 s a run: a 1x probe also runs on the CPU in seconds, 256x takes about 60 s a
#     sample there, and 1,024x is where the word rule costs the preset's best runs their points), then the
#     whole GPU test suite
#     (`pytest -m gpu tests`, run file by file since the twelfth session; TEST_FILES names fewer, e.g. the
#     files a cut run did not reach) for at most $TEST_SECONDS (default 400) seconds.
# The small outputs of a call (device_plan's log and status, the run directories without checkpoints, the
# tests' log) go into ONE file, $OUT/issue15_<part>.tgz. Environment: OUT (default ./issue15_call_out),
# WINDOW (device_plan's --seconds for base, all attempts together, and phases: default 560 and 540, less where
# the session's device time is short), BASE_ATTEMPTS (default 2), SECOND_PHASES (the second phases' plan runs
# for phases and after: default all three; a shorter list, e.g. the control and the value look-alikes, for a
# short budget), PROBE_MULTIPLIERS (after's probe lengths, default "1 256 1024"), TEST_SECONDS, TEST_FILES,
# PLAN (default benchmarks/plans/issue15_b128.json; a plan with the same run names and tiny flags, and
# PROBE_MULTIPLIERS=1, dry-run this on the CPU).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-issue15_call_out}
plan=${PLAN:-benchmarks/plans/issue15_b128.json}
part=${1:?base, phases or after}
mkdir -p "$out" runs/plan
plan_call() {  # plan_call LOG ARGS...: device_plan.py on $plan, its output also in runs/plan/LOG
  local log=$1
  shift
  python benchmarks/device_plan.py "$plan" "$@" 2>&1 | tee -a "runs/plan/$log"
}
base_stalled=runs/plan/mqmtar_asentmax_preset.stalled
second_phases=${SECOND_PHASES:-mqmtar_asentmax_preset_then_lr2e-5 mqmtar_asentmax_preset_then_lookalikes0.1 \
  mqmtar_asentmax_preset_then_value_lookalikes0.1}
case $part in
  base)
    attempts=${BASE_ATTEMPTS:-2}
    for attempt in $(seq "$attempts"); do
      plan_call call_base.log --work runs/plan --seconds "$((${WINDOW:-560} - SECONDS))" \
        --runs mqmtar_asentmax_preset
      [ -e "$base_stalled" ] && [ "$attempt" -lt "$attempts" ] || break
      for file in runs/plan/mqmtar_asentmax_preset runs/plan/mqmtar_asentmax_preset.*; do
        mv "$file" "${file/mqmtar_asentmax_preset/mqmtar_asentmax_preset_stalled$attempt}"
      done
      # the attempt's state lines too, so that record_runs.py counts its seconds to it, not to the base
      sed -i "s/^mqmtar_asentmax_preset:/mqmtar_asentmax_preset_stalled$attempt:/" runs/plan/call_base.log
      echo "attempt $attempt stopped at a stall check: set aside as mqmtar_asentmax_preset_stalled$attempt;" \
        "training the base again" | tee -a runs/plan/call_base.log
    done ;;
  phases)
    if [ -e "$base_stalled" ]; then
      echo "the base stopped at a stall check (runs/plan/mqmtar_asentmax_preset): no second phases from it" \
        | tee -a runs/plan/call_phases.log
    else
      plan_call call_phases.log --work runs/plan --seconds "${WINDOW:-540}" --continuing \
        --runs mqmtar_asentmax_preset $second_phases
      python benchmarks/carry_checkpoint.py pack runs/plan/mqmtar_asentmax_preset "$out" 2>&1 \
        | tee -a runs/plan/call_phases.log
    fi ;;
  after)
    for run in mqmtar_asentmax_preset $second_phases; do
      timeout 120 python benchmarks/mqmtar_errors.py "runs/plan/$run" \
        --multipliers ${PROBE_MULTIPLIERS:-1 256 1024} --samples 100 --lookalikes 1 --lookalike-kinds value \
        --out "runs/plan/$run/value_lookalike_probe" 2>&1 | tail -n 4 | tee -a runs/plan/call_after.log
    done
    # SIGINT: a suite the limit cuts still prints its durations and where it stood
    timeout -s INT -k 30 "${TEST_SECONDS:-400}" python -m pytest -v -p no:cacheprovider -m gpu -rfE \
      --durations=30 ${TEST_FILES:-tests} > runs/plan/gpu_tests.log 2>&1
    echo "GPU tests: exit $?, $(grep -c ' PASSED' runs/plan/gpu_tests.log) passed, $(grep -c ' FAILED' \
      runs/plan/gpu_tests.log) failed (runs/plan/gpu_tests.log)" | tee -a runs/plan/call_after.log ;;
  *) echo "unknown part $part: base, phases or after" >&2; exit 2 ;;
esac
tar -czf "$out/issue15_$part.tgz" --exclude="*.pt" --exclude=.compile_cache runs/plan
echo "wrote $out/issue15_$part.tgz"
