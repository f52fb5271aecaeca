"""Tuning sweep of the entmax decoding launchers (one-launch kernel, split path) on the GPU vs SDPA.

Issue 14: at 1K-4K keys the kernel is latency-bound (about 0.9 us a key tile, results/decode_gpu.md); larger
tiles, more warps or software pipelining may put more loads in flight. For each case (B, H, Hkv, q_len, D,
cache) of CASES (bf16, alpha = 1.5, non-causal) and each config of SWEEP (block_n keys a tile, num_warps,
num_stages: the launcher's tuning knobs) with pack = 1 and, where the group is > 1, pack =
attention_common.heads_per_program (the query heads of a KV head in one program):
- the GPU time alone (bench_decode_gpu.gpu_ms: calls replayed from a CUDA graph, each after an L2 flush,
  less the flushes), beside the default's (the library's launcher, entmax_attention_decode) and SDPA's
  (torch.nn.functional.scaled_dot_product_attention, enable_gqa for grouped K/V heads), timed in the same run;
- max |out - out_default| and whether the support sizes equal the default's; the best config is the
  fastest that agrees with the default (agrees: max |diff| <= MAX_DIFF and support sizes within the
  decoding tests' slack, max(1, 2% of the largest support)).
`--paths split` (or both, `--paths short split`) sweeps the split-over-keys launcher of attention_decode.py
instead, on SPLIT_CASES, its knobs SPLIT_SWEEP (chunk keys a program, block_n keys a tile, num_warps, solve:
the output kernel finds the thresholds instead of their own launch; pack = heads_per_program, the query heads
of a KV head in one program, and also pack = 1 where packs would leave fewer than FEW_PACKS programs a chunk
(B = 1: a program per query head reads its KV head from L2 after the first, for 4x the programs): the grouped
and single-sequence cases where the one-launch kernel is over 2x SDPA's GPU time (twenty-second session).
Each row names its path; "default" is always the launcher the library calls (entmax_attention_decode), so
the two paths' rows compare against the same time.
Configs whose K or V tile buffers (num_stages of BLOCK_N x BLOCK_D bf16) exceed SHARED_BYTES are pruned; a
config that fails to compile or launch is recorded with its one-line reason. Worker processes (--jobs) first
compile every config in parallel into Triton's cache, then the timing runs alone on the GPU. 16 cases, 450
configs: 60 pruned (D = 128 with block_n 512 at 2-3 stages), 390 timed; 75 s on an H200 with 16 CPUs
(fifteenth session, results/tune_decode.md); --seconds (default 180) stops the sweep, later configs recorded
as skipped. Since that run the one-launch kernel's defaults are its fastest configs (tuned_launch of
attention_decode_short.py, caches of >= 1024 keys), so a re-run compares the configs against those.

    PYTHONPATH=src python benchmarks/tune_decode_gpu.py --out results

writes results/tune_decode.json and results/tune_decode.md (rewritten after each case, so a run cut short
keeps what it measured): per case the default's, the best config's and SDPA's times and their ratios, and a
table of every config. --dry-run runs the same sweep on the CPU under TRITON_INTERPRET=1 (tiny fp32 cases,
wall-clock times, an invalid block_n = 8 among the configs so that a failure is recorded), e.g.

    TRITON_INTERPRET=1 PYTHONPATH=src python benchmarks/tune_decode_gpu.py --dry-run --out /tmp/tune
"""

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool

import torch
import torch.nn.functional as F
from bench_decode_gpu import gpu_ms

from asentmax.ops.triton.attention import _MAX_NEWTON_PASSES, _TOL
from asentmax.ops.triton.attention_common import heads_per_program, mode_of, next_power_of_2
from asentmax.ops.triton.attention_decode import entmax_attention_decode, entmax_attention_decode_split
from asentmax.ops.triton.attention_decode_short import entmax_attention_decode_short

# (B, H, Hkv, q_len, D, cache): grouped (GQA), then multi-head
CASES = ([(8, 16, 4, 1, dim, cache) for dim in (64, 128) for cache in (1024, 2048, 4096)]
         + [(1, 32, 8, 1, 128, 1024), (1, 32, 8, 1, 128, 4096), (8, 32, 4, 1, 128, 4096)]
         + [(8, 16, 16, 1, dim, cache) for dim in (64, 128) for cache in (1024, 2048, 4096)]
         + [(8, 16, 16, 4, 64, 2048)])
SWEEP = dict(block_n=(128, 256, 512), num_warps=(4, 8), num_stages=(1, 2, 3))
SPLIT_CASES = ([(8, 16, 4, 1, dim, cache) for dim in (64, 128) for cache in (1024, 2048, 4096)]
               + [(1, 32, 8, 1, 128, 1024), (1, 32, 8, 1, 128, 4096), (8, 32, 4, 1, 128, 4096)]
               + [(8, 16, 16, 1, dim, 4096) for dim in (64, 128)])
SPLIT_SWEEP = dict(chunk=(256, 512, 1024), block_n=(64, 128, 256), num_warps=(4, 8), solve=(True, False))
FEW_PACKS = 32  # split cases whose packs give fewer programs a chunk also sweep pack = 1
DRY_CASES = [(1, 4, 2, 1, 32, 100), (1, 2, 2, 3, 16, 70)]  # grouped, Nq 1; multi-head, Nq 3
DRY_SWEEP = dict(block_n=(8, 32, 64), num_warps=(4,), num_stages=(1, 2))  # 8: refused by the launcher
DRY_SPLIT_SWEEP = dict(chunk=(64, 128), block_n=(32, 64), num_warps=(4,), solve=(True, False))
KNOBS = {"short": ("block_n", "num_warps", "num_stages", "pack"),
         "split": ("chunk", "block_n", "num_warps", "solve", "pack")}
ALPHA = 1.5
SHARED_BYTES = 227 * 1024  # the H200's shared memory a block
MAX_DIFF = {torch.bfloat16: 2e-2, torch.float32: 1e-4}


def shared_bytes(block_n, dim, num_stages):
    """Estimated shared memory of a config: num_stages buffers of a BLOCK_N x BLOCK_D bf16 K or V tile."""
    return num_stages * block_n * max(16, next_power_of_2(dim)) * 2


def case_configs(case, sweep, path="short"):
    """Every config of the sweep for a case and launcher path: dicts of the path's KNOBS plus "path", with
    "pruned" (the reason) where a short config's tiles exceed SHARED_BYTES or a split config's tile does
    not divide its chunk. Short: pack 1 and, grouped, heads_per_program's; split: heads_per_program's, and
    pack 1 too where B * H / that pack < FEW_PACKS."""
    batch, heads, kv_heads, n_q, dim, _ = case
    group = heads // kv_heads
    packed = heads_per_program(group, n_q)
    configs = []
    if path == "split":
        split_packs = (packed, 1) if packed > 1 and batch * heads // packed < FEW_PACKS else (packed,)
        for pack, chunk, block_n, num_warps, solve in itertools.product(
                split_packs, sweep["chunk"], sweep["block_n"], sweep["num_warps"], sweep["solve"]):
            config = dict(path=path, chunk=chunk, block_n=block_n, num_warps=num_warps, solve=solve,
                          pack=pack)
            if chunk % block_n:
                config["pruned"] = f"block_n {block_n} does not divide chunk {chunk}"
            configs.append(config)
        return configs
    packs = (1, packed) if group > 1 else (1,)
    for pack, block_n, num_warps, num_stages in itertools.product(
            packs, sweep["block_n"], sweep["num_warps"], sweep["num_stages"]):
        config = dict(path=path, block_n=block_n, num_warps=num_warps, num_stages=num_stages, pack=pack)
        need = shared_bytes(block_n, dim, num_stages)
        if need > SHARED_BYTES:
            config["pruned"] = f"~{need // 1024} KB of tiles > {SHARED_BYTES // 1024} KB shared"
        configs.append(config)
    return configs


def case_inputs(case, device, dtype):
    """q (B, H, q_len, D), k and v (B, Hkv, cache, D), random normal, seeded."""
    b, h, hkv, n_q, dim, cache = case
    gen = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.randn(b, heads, n, dim, generator=gen, device=device, dtype=dtype)
                 for heads, n in ((h, n_q), (hkv, cache), (hkv, cache)))


def decode(q, k, v, knobs):
    """A launcher on q, k, v: {} the library's (entmax_attention_decode), else the one of knobs["path"]
    (the one-launch kernel or the split path) with the path's other knobs."""
    options = dict(mode=mode_of(ALPHA), alpha=ALPHA, scale=q.shape[-1] ** -0.5, causal=False, slopes=None,
                   q_scale=None, kpm=None, tol=_TOL[q.dtype], max_iter=_MAX_NEWTON_PASSES)
    if not knobs:
        return entmax_attention_decode(q, k, v, **options)
    knobs = dict(knobs)
    split = knobs.pop("path") == "split"
    launcher = entmax_attention_decode_split if split else entmax_attention_decode_short
    return launcher(q, k, v, **options, **knobs)


def knobs_of(config):
    return {name: config[name] for name in ("path",) + KNOBS[config["path"]]}


def one_line(exc):
    """An exception as one line: its type and the first line of its message, at most 200 characters."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:200]


_worker_inputs = {}  # a compile worker's inputs of its last case


def compile_config(task):
    """Worker of precompile: one launch of a config (case, knobs, device, dtype name), which compiles it into
    Triton's on-disk cache. Returns whether it launched."""
    case, knobs, device, dtype_name = task
    key = (case, device, dtype_name)
    if key not in _worker_inputs:
        _worker_inputs.clear()
        _worker_inputs[key] = case_inputs(case, device, getattr(torch, dtype_name))
    try:
        with torch.no_grad():
            decode(*_worker_inputs[key], knobs)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception:  # measure_config records the reason when the config fails again in the timing process
        return False
    return True


def precompile(tasks, jobs, deadline):
    """Warms Triton's cache: compile_config over `tasks` in `jobs` spawned processes, so that the timing
    process then loads the compiled kernels. Stops at the deadline or when a worker dies; the configs not
    compiled then compile at their first timed call."""
    executor = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
    futures = [executor.submit(compile_config, task) for task in tasks]
    failed = 0
    try:
        for done, future in enumerate(as_completed(futures, timeout=max(0.0, deadline - time.perf_counter())),
                                      1):
            failed += not future.result()
            if done % 25 == 0 or done == len(tasks):
                print(f"compiled {done}/{len(tasks)} configs ({failed} failed)", flush=True)
    except (TimeoutError, BrokenProcessPool) as exc:
        print(f"precompiling stopped: {type(exc).__name__} {exc}", flush=True)
        executor.shutdown(wait=False, cancel_futures=True)
    else:
        executor.shutdown()  # the workers leave the GPU before the timing


def measure_config(config, q, k, v, timer, out_default, support_default, max_diff):
    """Times one config into `config` (ms), with max_abs_diff, support_equal and agrees (max |diff| <=
    max_diff and support sizes within the decoding tests' slack), or "failed" with the reason."""
    knobs = knobs_of(config)
    try:
        out, _, support = decode(q, k, v, knobs)
        config["ms"] = timer(lambda: decode(q, k, v, knobs))
    except Exception as exc:  # a config that cannot compile or launch: recorded, the sweep goes on
        config["failed"] = one_line(exc)
        return
    config["max_abs_diff"] = (out.float() - out_default.float()).abs().max().item()
    gap = (support.long() - support_default.long()).abs().max().item()
    config["support_equal"] = gap == 0
    config["agrees"] = config["max_abs_diff"] <= max_diff and gap <= max(1, int(0.02 * support_default.max()))


def sweep_case(case, configs, timer, device, dtype, deadline, path="short"):
    """The case's row for one launcher path: the default's (the library's launcher) and SDPA's times, and
    each of `configs` (case_configs) measured into it, unless pruned or past the deadline (then skipped, as
    the whole case past it)."""
    b, h, hkv, n_q, dim, cache = case
    row = dict(path=path, B=b, H=h, Hkv=hkv, q_len=n_q, D=dim, cache=cache, configs=configs)
    if time.perf_counter() > deadline:
        for config in configs:
            if "pruned" not in config:
                config["skipped"] = "time budget"
        return row
    q, k, v = case_inputs(case, device, dtype)
    with torch.no_grad():
        out_default, _, support_default = decode(q, k, v, {})
        row["default_ms"] = timer(lambda: decode(q, k, v, {}))
        row["sdpa_ms"] = timer(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != h))
        for config in configs:
            if "pruned" not in config and time.perf_counter() > deadline:
                config["skipped"] = "time budget"
            elif "pruned" not in config:
                measure_config(config, q, k, v, timer, out_default, support_default, MAX_DIFF[dtype])
            print(f"  {config_label(config)}: {config_status(config)}", flush=True)
    row["default_vs_sdpa"] = row["default_ms"] / row["sdpa_ms"]
    agreeing = [c for c in configs if c.get("agrees")]
    if agreeing:
        best = min(agreeing, key=lambda c: c["ms"])
        row.update(best=knobs_of(best), best_ms=best["ms"], best_vs_sdpa=best["ms"] / row["sdpa_ms"])
    print(f"  default {row['default_ms']:.4f} ms, SDPA {row['sdpa_ms']:.4f} ms, best "
          + (f"{config_label(row['best'])} {row['best_ms']:.4f} ms" if agreeing else "none"), flush=True)
    return row


def config_label(config):
    """short: block_n/num_warps/num_stages pack P; split: chunk C block_n/num_warps solve|threshold pack P."""
    if config["path"] == "split":
        solve = "solve" if config["solve"] else "threshold"
        return (f"chunk {config['chunk']} {config['block_n']}/{config['num_warps']} {solve} "
                f"pack {config['pack']}")
    return f"{config['block_n']}/{config['num_warps']}/{config['num_stages']} pack {config['pack']}"


def config_status(config):
    """'ok' (agrees with the default), 'differs' (timed, but not a candidate for the best), or why it has
    no time: pruned, failed or skipped, with the reason."""
    for status in ("pruned", "failed", "skipped"):
        if status in config:
            return f"{status}: {config[status]}"
    return "ok" if config["agrees"] else "differs"


def case_label(row):
    return f"{row['path']} {row['B']}/{row['H']}/{row['Hkv']}/{row['q_len']}/{row['D']}/{row['cache']}"


def markdown(report):
    info = report["info"]

    def number(row, key, spec):
        return format(row[key], spec) if key in row else "-"

    lines = [f"# Tuning the decoding launchers on {info['device']} "
             f"(torch {info['torch']}, triton {info['triton']})", "",
             f"Command: `{info['command']}` ({info['seconds']:.0f} s)", "",
             f"{info['dtype']}, non-causal, alpha = {info['alpha']} vs softmax SDPA; {info['timer']}. "
             "Rows: path B/H/Hkv/q_len/D/cache. Config (the launcher's knobs; pack: query heads a program): "
             "short = block_n/num_warps/num_stages pack P, split = chunk C block_n/num_warps, solve (the "
             "output kernel finds the thresholds) or threshold (their own launch), pack P; default = the "
             "library's launcher (entmax_attention_decode) without knobs. Best = the fastest config that "
             f"agrees with the default (max abs diff <= {info['max_diff']:g}, support sizes within max(1, 2% "
             "of the largest)). Counts: configs ok / differ / failed / pruned / skipped.", "",
             "| B/H/Hkv/q_len/D/cache | default ms | best config | best ms | SDPA ms | default/SDPA "
             "| best/SDPA | default/best | counts |",
             "|---" * 9 + "|"]
    for row in report["rows"]:
        statuses = [config_status(c).split(":")[0] for c in row["configs"]]
        counts = " / ".join(str(statuses.count(s)) for s in ("ok", "differs", "failed", "pruned", "skipped"))
        best = config_label(row["best"]) if "best" in row else "-"
        speedup = f"{row['default_ms'] / row['best_ms']:.2f}" if "best_ms" in row else "-"
        lines.append(f"| {case_label(row)} | {number(row, 'default_ms', '.4f')} | {best} | "
                     f"{number(row, 'best_ms', '.4f')} | {number(row, 'sdpa_ms', '.4f')} | "
                     f"{number(row, 'default_vs_sdpa', '.2f')} | {number(row, 'best_vs_sdpa', '.2f')} | "
                     f"{speedup} | {counts} |")
    lines += ["", "Every config:", "",
              "| path B/H/Hkv/q_len/D/cache | config | ms | /default | max abs diff | support equal "
              "| status |",
              "|---" * 7 + "|"]
    for row in report["rows"]:
        for c in row["configs"]:
            timed = (f"{c['ms']:.4f} | {c['ms'] / row['default_ms']:.2f} | {c['max_abs_diff']:.2g} | "
                     f"{c['support_equal']}") if "ms" in c else "- | - | - | -"
            lines.append(f"| {case_label(row)} | {config_label(c)} | {timed} | {config_status(c)} |")
    return "\n".join(lines) + "\n"


def wall_ms(fn, calls=2):
    """The dry run's timer: wall-clock milliseconds of one fn() call, the fastest of `calls`."""
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results", help="directory for tune_decode.json and tune_decode.md")
    parser.add_argument("--seconds", type=float, default=180.0,
                        help="time budget of the run: configs past it are skipped (default 180)")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1),
                        help="processes compiling the configs before the timing (0: each compiles at its "
                             "first timed call; default min(16, CPUs))")
    parser.add_argument("--paths", nargs="+", choices=("short", "split"), default=["short"],
                        help="the launchers to sweep: short (the one-launch kernel on CASES, the default) "
                             "and/or split (the split path on SPLIT_CASES)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny fp32 cases on the CPU under TRITON_INTERPRET=1, wall-clock timed")
    args = parser.parse_args(argv)
    if args.jobs < 0 or args.seconds < 0:
        parser.error("--jobs and --seconds must be >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("--dry-run runs the kernels on the CPU: set TRITON_INTERPRET=1")
        plans = dict(short=(DRY_CASES, DRY_SWEEP), split=(DRY_CASES, DRY_SPLIT_SWEEP))
        device, dtype, timer = "cpu", torch.float32, wall_ms
        device_name, timer_text = "the CPU (dry run)", "ms = wall-clock time of a call, not a GPU time"
    else:
        if not torch.cuda.is_available():
            sys.exit("tune_decode_gpu.py needs a CUDA device (none found; --dry-run runs on the CPU)")
        plans = dict(short=(CASES, SWEEP), split=(SPLIT_CASES, SPLIT_SWEEP))
        device, dtype, timer = "cuda", torch.bfloat16, gpu_ms
        device_name = torch.cuda.get_device_name()
        timer_text = "ms = GPU time alone (CUDA graph replays after an L2 flush, less the flushes)"
    import triton

    started = time.perf_counter()
    deadline = started + args.seconds
    work = [(path, case, case_configs(case, plans[path][1], path)) for path in args.paths
            for case in plans[path][0]]
    dtype_name = str(dtype).removeprefix("torch.")
    tasks = [(case, knobs_of(c), device, dtype_name) for _, case, configs in work for c in configs
             if "pruned" not in c]
    total = sum(len(configs) for _, _, configs in work)
    print(f"{len(work)} cases, {total} configs, {total - len(tasks)} pruned, {len(tasks)} to time",
          flush=True)
    if args.jobs:  # the configs and each case's default
        defaults = [(case, {}, device, dtype_name) for case in dict.fromkeys(case for _, case, _ in work)]
        precompile(tasks + defaults, args.jobs, deadline)
    info = dict(command="PYTHONPATH=src python " + " ".join(sys.argv), device=device_name,
                torch=torch.__version__, triton=triton.__version__, dtype=dtype_name,
                alpha=ALPHA, timer=timer_text, max_diff=MAX_DIFF[dtype], configs=total, timed=len(tasks),
                jobs=args.jobs, seconds=0.0)
    report = dict(info=info, rows=[])
    os.makedirs(args.out, exist_ok=True)
    for number, (path, case, configs) in enumerate(work, 1):
        print(f"case {number}/{len(work)} {path} (B, H, Hkv, q_len, D, cache) = {case}", flush=True)
        report["rows"].append(sweep_case(case, configs, timer, device, dtype, deadline, path))
        info["seconds"] = time.perf_counter() - started
        with open(os.path.join(args.out, "tune_decode.json"), "w") as fh:
            json.dump(report, fh, indent=1)
        with open(os.path.join(args.out, "tune_decode.md"), "w") as fh:
            fh.write(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
