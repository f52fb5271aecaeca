#!/usr/bin/env bash
# LM runs of arXiv:2506.16640, section 5 at one-GPU scale: all presets at once, spread over the GPUs (several share one GPU when there are fewer GPUs), each stopped
# (with a checkpoint, by SIGTERM) before the 10-minute limit of one device call. Needs data/lm from
# `asentmax lm prepare` (carry it). Small outputs are copied to $OUT/lm when $OUT is set.
#   bash benchmarks/lm_gpu_runs.sh train [PRESET ...]   # default: the four below, GPUs 0..3
#   bash benchmarks/lm_gpu_runs.sh eval  [PRESET ...]   # then compare into results/lm (and $OUT/lm)
#   bash benchmarks/lm_gpu_runs.sh smoke [PRESET ...]   # 60 steps: tokens/s of each preset
# Environment: LIMIT (s per run, 540), STEPS (2500), SIZE (lm_25m), TRAIN_FLAGS (extra train flags; compile
# and fused AdamW are on by default on CUDA),
# EVAL_FLAGS (extra eval flags). CPU dry run: SIZE=lm_tiny STEPS=3 TRAIN_FLAGS="--device cpu --batch-size 4"
set -u
mode=${1:?train, eval or smoke}; shift
if [ $# -gt 0 ]; then presets=("$@"); else presets=(softmax_rope ssmax_nape entmax_nape asentmax_nape); fi
export PYTHONPATH=src
LIMIT=${LIMIT:-540}
STEPS=${STEPS:-2500}
SIZE=${SIZE:-lm_25m}
read -r -a train_flags <<< "${TRAIN_FLAGS:-}"
read -r -a eval_flags <<< "${EVAL_FLAGS:-}"
mkdir -p runs/lm
gpus=$(nvidia-smi -L 2>/dev/null | wc -l); [ "$gpus" -gt 0 ] || gpus=1
run=0
for p in "${presets[@]}"; do
  case $mode in
    train) args=(train --run-dir "runs/lm/$p" --steps "$STEPS") ;;
    smoke) rm -rf "runs/lm/smoke_$p"
           args=(train --run-dir "runs/lm/smoke_$p" --steps 60 --log-every 10 --val-every 0) ;;
    eval)  args=(eval "runs/lm/$p" "${eval_flags[@]}") ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  if [ "$mode" != eval ]; then
    args+=(--preset "$p" --data data/lm --size "$SIZE" --no-progress "${train_flags[@]}")
  fi
  CUDA_VISIBLE_DEVICES=$((run % gpus)) timeout -s TERM "$LIMIT" python -m asentmax lm "${args[@]}" \
    > "runs/lm/${mode}_$p.log" 2>&1 &
  run=$((run + 1))
done
wait
tail -n 3 runs/lm/"${mode}"_*.log
if [ "$mode" = eval ]; then
  python -m asentmax lm compare "${presets[@]/#/runs/lm/}" --out results/lm
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/lm"
  cp runs/lm/*.log "$OUT/lm/"
  for d in runs/lm/*/; do
    mkdir -p "$OUT/lm/$(basename "$d")"
    for f in config.json log.csv val.csv lm_train.json lm_eval.json lm_eval.md perplexity.png retrieval.png; do
      [ -f "$d/$f" ] && cp "$d/$f" "$OUT/lm/$(basename "$d")/"
    done
  done
  if [ "$mode" = eval ]; then cp results/lm/compare.md results/lm/*.png "$OUT/lm/"; fi
fi
true
