#!/usr/bin/env bash
# One device call of issue 15's plan (benchmarks/plans/issue15_b128.json), as results/session*_gpu/README.md
# give them; chain the calls while the machine is warm, since runs/plan lives only on it (a machine may also keep
# it from an earlier session: device_plan.py then refuses the old runs it names, so a session's first call starts
# with `rm -rf runs/plan runs/screens;`):
#   OUT=$OUT bash benchmarks/device_calls.sh plan SECONDS RUN... [--continuing]
#     device_plan.py with the named runs side by side for SECONDS (runs a stall check stopped stay stopped)
#   OUT=$OUT bash benchmarks/device_calls.sh screens SECONDS RUN...
#     the same in a --work of their own (runs/screens; $OUT/screens_plan.log, $OUT/screens.tgz), to run with `&`
#     beside a `plan` part, then `wait`: short screens (runs whose readout is an early validation) share a call
#     with long runs; each part stops only its own leftover processes, so a plan part that ends first leaves the
#     screens to their window (before the forty-third session it stopped them)
#   OUT=$OUT bash benchmarks/device_calls.sh eval RUN...
#     `asentmax eval` (300 samples a length) of runs a stall check stopped: their last checkpoint, whose
#     eval.json record_runs.py keeps as eval_at_stall.json
#   OUT=$OUT bash benchmarks/device_calls.sh pack RUN...
#     carry_checkpoint.py pack of finished runs into $OUT (two 15 MB parts each), for reading heads on the CPU
#   bash benchmarks/device_calls.sh chimeras [NAME...]
#     benchmarks/chimera_init.py's start checkpoints of the plan's reverse_..._chimera_* runs into runs/chimera,
#     only the NAMEs given (e.g. io1_blocks01_rest8; each start draws both seeds' models again) or else all
#     (seed 8's init with seed 1's embedding and head, lower or upper three blocks, or embedding, head and either
#     half, one block or two blocks of one half; seed 1's with seed 8's embedding, head or both, or the embedding
#     rows of the special tokens or of the symbols; seed 1's own as a control); run it before their `plan` call
#     on a fresh machine
# Each part ends by putting runs/plan without weights into $OUT/plan.tgz (record_runs.py's --work).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
part=${1:?plan, screens, eval, pack or chimeras}
shift
side_by_side() {  # WORK LOG SECONDS RUN...: device_plan.py, its printed states into $OUT/LOG
    python benchmarks/device_plan.py benchmarks/plans/issue15_b128.json --work "$1" --seconds "${3:?SECONDS}" \
        --runs "${@:4}" > "$OUT/$2" 2>&1
    tail -14 "$OUT/$2"
}
without_weights() {  # TGZ WORK: WORK without weights, caches and tensorboard into $OUT/TGZ
    tar czf "$OUT/$1" --exclude='*.pt' --exclude=tensorboard --exclude=.compile_cache "$2"
}
stop_leftovers() {  # WORK: a timed-out step's processes of WORK's runs must not outlive the call (a pattern that
    # cannot match this shell's command line); the runs of another part's --work go on
    pkill -f -- "-m asentmax (train --run-dir |eval )$1/"; true
}
case $part in
plan)
    side_by_side runs/plan device_plan.log "$@"
    shift
    # each evaluated run's exact match per length, to choose the next call while the machine is warm
    for run in "$@"; do
        for table in runs/plan/"$run"/eval*.md; do
            [ -f "$table" ] && echo "$run $(basename "$table" .md): $(awk -F'|' \
                '/^\| [0-9]+ \| [0-9.]+x \|/ {gsub(/ /, "", $3); gsub(/ /, "", $4); printf "%s %s  ", $3, $4}' "$table")"
        done
    done
    ;;
screens)
    side_by_side runs/screens screens_plan.log "$@"
    without_weights screens.tgz runs/screens
    stop_leftovers runs/screens
    exit 0
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
chimeras)
    source=results/paper/reverse/asentmax_b128_paper_blocks
    wanted=" $* " written=" "
    chimera() {  # NAME BASE DONOR PREFIX... | NAME BASE DONOR --donor-embedding-tokens TOKEN...
        [ "$wanted" = "  " ] || [[ $wanted == *" $1 "* ]] || return 0
        if [ "$4" = --donor-embedding-tokens ]; then from=("${@:4}"); else from=(--from-donor "${@:4}"); fi
        python benchmarks/chimera_init.py "$source" --base-seed "$2" --donor-seed "$3" "${from[@]}" \
            --out "runs/chimera/$1.pt" || exit 2
        written+="$1 "
    }
    chimera io1_rest8 8 1 embed. head.
    chimera lower1_rest8 8 1 blocks.0. blocks.1. blocks.2.
    chimera upper1_rest8 8 1 blocks.3. blocks.4. blocks.5.
    chimera io8_rest1 1 8 embed. head.
    chimera control1 1 1 embed. head.  # seed 1's own init, through chimera_init and --init-from
    chimera embed8_rest1 1 8 embed.
    chimera head8_rest1 1 8 head.
    chimera io1_lower1_rest8 8 1 embed. head. blocks.0. blocks.1. blocks.2.
    chimera io1_upper1_rest8 8 1 embed. head. blocks.3. blocks.4. blocks.5.
    chimera io1_block0_rest8 8 1 embed. head. blocks.0.
    chimera io1_block1_rest8 8 1 embed. head. blocks.1.
    chimera io1_block2_rest8 8 1 embed. head. blocks.2.
    chimera io1_block3_rest8 8 1 embed. head. blocks.3.
    chimera io1_block4_rest8 8 1 embed. head. blocks.4.
    chimera io1_block5_rest8 8 1 embed. head. blocks.5.
    chimera io1_blocks01_rest8 8 1 embed. head. blocks.0. blocks.1.  # pairs of blocks within one half
    chimera io1_blocks02_rest8 8 1 embed. head. blocks.0. blocks.2.
    chimera io1_blocks12_rest8 8 1 embed. head. blocks.1. blocks.2.
    chimera io1_blocks34_rest8 8 1 embed. head. blocks.3. blocks.4.
    chimera io1_blocks35_rest8 8 1 embed. head. blocks.3. blocks.5.
    chimera io1_blocks45_rest8 8 1 embed. head. blocks.4. blocks.5.
    chimera special8_rest1 1 8 --donor-embedding-tokens 0 1 2 3  # <pad> <bos> <sep> <eos>
    chimera symbols8_rest1 1 8 --donor-embedding-tokens $(seq 4 35)  # the 32 symbols
    for name in $wanted; do
        [[ $written == *" $name "* ]] || { echo "chimeras: no start named $name" >&2; exit 2; }
    done
    exit 0
    ;;
*)
    echo "part must be plan, screens, eval, pack or chimeras" >&2; exit 2
    ;;
esac
without_weights plan.tgz runs/plan
stop_leftovers runs/plan
pkill -x nvidia-smi; true
