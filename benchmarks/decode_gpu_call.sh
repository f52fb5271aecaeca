#!/usr/bin/env bash
# Issue 14's decoding checks and timings in device calls, each step under its own time limit so that a failing
# or slow step leaves the others their time:
#   bash benchmarks/decode_gpu_call.sh checks       # 6-8 minutes on one H200:
#     the GPU tests of the decoding kernels, compiled decoding and CUDA-graph decoding (static cache), then
#     bench_generate.py: model-level decoding, buffered cache vs concatenating, compiled and CUDA graph;
#   bash benchmarks/decode_gpu_call.sh eval_graphs  # about 4 minutes:
#     `asentmax eval` with --cuda-graphs off and on (seconds per length, same answers) of two briefly trained
#     ASEntmax models: Reverse (answers as long as the source: 3.3-11x faster with graphs in the twenty-sixth
#     session) and MQMTAR (12 answer tokens over prompts up to 256x: few replays for each batch's recorded
#     graph, so the default auto may not pay there);
#   bash benchmarks/decode_gpu_call.sh lm_graphs    # about 4 minutes:
#     `asentmax lm eval` with --cuda-graphs off and on (its seconds for perplexity, needles and dispersion, the
#     same needle completions) of an lm_25m model trained for 30 steps on a corpus of random words (the timing
#     needs the model's shapes, not what it learned): needle answers of 10 tokens over prompts of 512-8,192,
#     16 a batch, each batch recording its own graph (auto by default since the twenty-seventh session, which
#     had no GPU to time it);
#   bash benchmarks/decode_gpu_call.sh kernels      # about 7 minutes:
#     the split-path sweep of tune_decode_gpu.py (first: never run on a GPU), then the one-launch one (its
#     cases of results/tune_decode.md, after the twenty-second session's threshold-pass change), then
#     bench_decode_gpu.py: kernel-level decoding against SDPA (host and GPU time);
#   bash benchmarks/decode_gpu_call.sh graph_rule   # about 3 minutes:
#     the launcher's rule under CUDA-graph capture (thirtieth session, from the kernels part's sweep, not yet
#     timed): its GPU tests (a captured call against the fp64 reference), then bench_decode_gpu.py, whose GPU
#     columns replay captured graphs (its "graph path" column).
# Everything of a call goes into ONE file, $OUT/decode_<part>.tgz (logs, tables, json), within the device's
# 8 files. Environment: OUT (default ./decode_call_out), TUNE_SECONDS (the sweep's budget, 180).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
out=${OUT:-decode_call_out}
work=$(mktemp -d)
mkdir -p "$out"
step() {  # step NAME LIMIT_S COMMAND...: run, log to $work/NAME.log, note the exit status
  local name=$1 limit=$2
  shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$work/steps.log"
  local start=$SECONDS
  timeout "$limit" "$@" > "$work/$name.log" 2>&1
  local status=$?
  echo "== $name: exit $status after $((SECONDS - start))s" | tee -a "$work/steps.log"
  tail -n 5 "$work/$name.log"
}
graphs_off_on() {  # graphs_off_on PRESET LIMIT_S EVAL_FLAGS: 400 ASEntmax steps, then eval with graphs off, on
  step "eval_graphs_$1" "$2" bash -c "python -m asentmax train --preset $1 --attention asentmax --steps 400 \
    --run-dir $work/$1 --no-progress --val-every 0 && for graphs in off on; do python -m asentmax eval $work/$1 \
    --no-progress --samples 100 $3 --dispersion-samples 0 --fresh --cuda-graphs \$graphs \
    --output $work/$1_graphs_\$graphs || exit; done"
}
random_words() {  # random_words DIR: 40 documents of 12,000 words drawn from 3,000 random ones
  python - "$1" <<'PY'
import pathlib, random, sys
out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True)
rng = random.Random(0)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
for d in range(40):
    (out / f"doc{d}.txt").write_text(" ".join(rng.choice(words) for _ in range(12000)) + "\n")
PY
}
part=${1:?checks, eval_graphs, lm_graphs, kernels or graph_rule}
nvidia-smi --query-gpu=name,driver_version --format=csv > "$work/gpu.txt" 2>&1
case $part in
  checks)
    step tests 200 python -m pytest -q -m gpu tests/test_triton_attention_decode.py tests/test_compile_gpu.py \
      tests/test_nn_gpu.py -k "decode or compile or cuda_graph or cached" -rfE --durations=10
    step generate 220 python benchmarks/bench_generate.py --device cuda --prompts 1024 4096 16384 --new 64 \
      --compile --cuda-graph --out "$work/generate" ;;
  eval_graphs)
    graphs_off_on reverse 140 "--multipliers 1 2 4 8"
    graphs_off_on mqmtar 200 "--multipliers 1 16 64 256" ;;
  lm_graphs)
    random_words "$work/lm_text"
    step lm_graphs 280 bash -c "python -m asentmax lm prepare --text-folder $work/lm_text --out $work/lm_data \
      --vocab-size 2048 --context 512 --test-docs 8 --valid-docs 2 && python -m asentmax lm train --run-dir \
      $work/lm --data $work/lm_data --preset asentmax_nape --size lm_25m --steps 30 --val-every 0 --no-progress \
      && for graphs in off on; do python -m asentmax lm eval $work/lm --cuda-graphs \$graphs --multipliers 1 4 16 \
      --samples 64 && cp $work/lm/lm_eval.json $work/lm_graphs_\$graphs.json || exit; done" ;;
  kernels)
    step tune 240 python benchmarks/tune_decode_gpu.py --paths split short --seconds "${TUNE_SECONDS:-180}" \
      --out "$work/tune"
    step bench_decode 200 python benchmarks/bench_decode_gpu.py --out "$work/decode" ;;
  graph_rule)
    step tests 120 python -m pytest -q -m gpu tests/test_triton_attention_decode.py -k "graph or gpu" -rfE
    step bench_decode 200 python benchmarks/bench_decode_gpu.py --out "$work/decode" ;;
  *) echo "unknown part $part: checks, eval_graphs, lm_graphs, kernels or graph_rule" >&2; exit 2 ;;
esac
tar -czf "$out/decode_$part.tgz" --exclude="*.pt" -C "$work" .
echo "wrote $out/decode_$part.tgz"
