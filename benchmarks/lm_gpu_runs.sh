#!/usr/bin/env bash
# LM runs of arXiv:2506.16640, section 5 at one-GPU scale: the presets run at once, spread over the GPUs
# (several share one GPU when there are fewer GPUs), each training run stopped (with a checkpoint, by
# SIGTERM) at LIMIT seconds. Needs data/lm from `asentmax lm prepare` (carry it). With $OUT set, the small
# outputs (logs, configs, log.csv, evaluations, needle probes, compare.md, plots) go into ONE file,
# $OUT/lm_MODE.tgz.
#   bash benchmarks/lm_gpu_runs.sh train [PRESET ...]   # default: the four below, GPUs 0..3
#   bash benchmarks/lm_gpu_runs.sh eval  [PRESET ...]   # lm eval + benchmarks/lm_needle_probe.py per run,
#                                                       # then lm compare into results/lm
#   bash benchmarks/lm_gpu_runs.sh all   [PRESET ...]   # train, then eval, in one device call
#   bash benchmarks/lm_gpu_runs.sh smoke [PRESET ...]   # 60 steps: tokens/s of each preset
# Environment: LIMIT (s per training run, 540), EVAL_LIMIT (s for the evaluations and probes, which run
# at once, 60), STEPS (2500), SIZE (lm_25m), TRAIN_FLAGS (extra train flags, e.g. --retrieval-share 0;
# compile and fused AdamW are on by default on CUDA), EVAL_FLAGS (extra eval flags), PROBE_FLAGS (probe
# flags, default "--samples 50").
# One H200, both issue-16 models with the default retrieval share (0.1) for 301.5M token slots each
# (2,300 steps x 256 windows x 512): about 510 s expected, at most ~560 s (490 + 60 + compare, packing):
#   LIMIT=490 STEPS=2300 bash benchmarks/lm_gpu_runs.sh all softmax_rope asentmax_nape
# CPU dry run: SIZE=lm_tiny STEPS=3 TRAIN_FLAGS="--device cpu --batch-size 4" \
#   EVAL_FLAGS="--device cpu --multipliers 1 2 --samples 2" PROBE_FLAGS="--samples 2 --multipliers 1 2"
set -u
mode=${1:?train, eval, all or smoke}; shift
if [ $# -gt 0 ]; then presets=("$@"); else presets=(softmax_rope ssmax_nape entmax_nape asentmax_nape); fi
export PYTHONPATH=src
LIMIT=${LIMIT:-540}
EVAL_LIMIT=${EVAL_LIMIT:-60}
STEPS=${STEPS:-2500}
SIZE=${SIZE:-lm_25m}
read -r -a train_flags <<< "${TRAIN_FLAGS:-}"
read -r -a eval_flags <<< "${EVAL_FLAGS:-}"
read -r -a probe_flags <<< "${PROBE_FLAGS:---samples 50}"
mkdir -p runs/lm
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$gpus" -gt 0 ] || gpus=1

# launch NAME LIMIT COMMAND...: COMMAND once per preset ("{}" is the preset) in the background, logged to
# runs/lm/NAME_PRESET.log and stopped by SIGTERM after LIMIT seconds
launch() {
  local name=$1 limit=$2 run=0; shift 2
  for p in "${presets[@]}"; do
    CUDA_VISIBLE_DEVICES=$((run % gpus)) timeout -s TERM "$limit" "${@//\{\}/$p}" \
      > "runs/lm/${name}_$p.log" 2>&1 &
    run=$((run + 1))
  done
}

case $mode in train|eval|all|smoke) ;; *) echo "unknown mode $mode" >&2; exit 2 ;; esac
train_args=(--data data/lm --size "$SIZE" --no-progress "${train_flags[@]}")
if [ "$mode" = train ] || [ "$mode" = all ]; then
  launch train "$LIMIT" python -m asentmax lm train --run-dir "runs/lm/{}" --steps "$STEPS" --preset "{}" \
    "${train_args[@]}"
  wait
fi
if [ "$mode" = smoke ]; then
  rm -rf "${presets[@]/#/runs/lm/smoke_}"
  launch smoke "$LIMIT" python -m asentmax lm train --run-dir "runs/lm/smoke_{}" --steps 60 --log-every 10 \
    --val-every 0 --preset "{}" "${train_args[@]}"
  wait
fi
if [ "$mode" = eval ] || [ "$mode" = all ]; then  # the evaluations and the probes all at once
  launch eval "$EVAL_LIMIT" python -m asentmax lm eval "runs/lm/{}" "${eval_flags[@]}"
  launch probe "$EVAL_LIMIT" python benchmarks/lm_needle_probe.py "runs/lm/{}" --data data/lm \
    --out "runs/lm/{}" "${probe_flags[@]}"
  wait
  python -m asentmax lm compare "${presets[@]/#/runs/lm/}" --out results/lm
fi
tail -n 3 runs/lm/*.log
if [ -n "${OUT:-}" ]; then
  stage=$(mktemp -d)/lm
  mkdir -p "$stage"
  cp runs/lm/*.log "$stage/"
  for d in runs/lm/*/; do
    mkdir -p "$stage/$(basename "$d")"
    for f in config.json log.csv val.csv lm_train.json lm_eval.json lm_eval.md perplexity.png retrieval.png \
             needle_probe.json needle_probe.md; do
      [ -f "$d/$f" ] && cp "$d/$f" "$stage/$(basename "$d")/"
    done
  done
  if [ "$mode" = eval ] || [ "$mode" = all ]; then cp results/lm/compare.md results/lm/*.png "$stage/"; fi
  tar czf "$OUT/lm_$mode.tgz" -C "$(dirname "$stage")" lm
fi
true
