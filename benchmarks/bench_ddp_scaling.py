"""Data-parallel scaling of `asentmax train`, 1 vs 2 GPUs, and a 2-GPU checkpoint resumed on 1 GPU (issue 6).

Three runs of the MQMTAR preset with ASEntmax attention (`--preset mqmtar --attention asentmax`; on CUDA the
attention backend `auto` is the Triton kernels, bf16 autocast), all with the same global batch and schedule
(`--steps STEPS+RESUME_STEPS --stop-at-step STEPS`):

1. 1 GPU:  torchrun --standalone --nproc_per_node=1 -m asentmax train ... --stop-at-step STEPS
2. 2 GPUs: torchrun --standalone --nproc_per_node=2 -m asentmax train ... --stop-at-step STEPS (DDP, NCCL)
3. a copy of run 2's directory, resumed on 1 GPU (`--resume`) for the remaining RESUME_STEPS steps.

Throughput is steady state: the non-pad tokens train.py logs per window (`tokens`, all ranks) over the
`elapsed_s` between the first log line after the warm-up (first tenth of the steps, at least one window:
kernel compilation) and step STEPS. Scaling efficiency = tokens/s(2 GPUs) / (2 * tokens/s(1 GPU)).
The resumed run must log a first loss within 10% of run 2's last one (else exit status 1).

Writes to --out: README.md (table, commands, versions), ddp_scaling.json, loss_curves.png (1 vs 2 GPUs and
the resumed segment), logs.csv (every run's log.csv rows) and console.log; run directories (with their
checkpoints) go to --work-dir (default: a fresh temporary directory). NVLink multicast stays off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1).

    PYTHONPATH=src python benchmarks/bench_ddp_scaling.py --out results/ddp_scaling            # 2 GPUs
    PYTHONPATH=src python benchmarks/bench_ddp_scaling.py --device cpu --steps 3 --resume-steps 2 \\
        --batch-size 16 --out /tmp/ddp_dry_run                                   # CPU dry run, gloo
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
RESUME_TOLERANCE = 1.10  # the resumed run's first loss may exceed the 2-GPU run's last one by at most 10%


# ---- running ----

def train_command(nproc: int, run_dir: Path, args, resume: bool) -> list[str]:
    """torchrun (as `python -m torch.distributed.run`, the same program) of `asentmax train`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "asentmax", "train", "--run-dir", str(run_dir), "--no-progress"]
    if resume:
        return command + ["--resume"]
    total = args.steps + args.resume_steps
    return command + [
        "--preset", "mqmtar", "--attention", "asentmax", "--device", args.device,
        "--steps", str(total), "--stop-at-step", str(args.steps), "--batch-size", str(args.batch_size),
        # floor and seed as the preset gave them before the tenth session (cosine to 0, seed 1 since)
        "--warmup-steps", str(max(1, total // 10)), "--min-lr-ratio", "0.1", "--seed", "0",
        "--log-every", str(log_every(args.steps)), "--val-every", "0", "--checkpoint-every", "0"]


def log_every(steps: int) -> int:
    """About 40 log lines up to `steps`, at an interval dividing it (so step `steps` is logged)."""
    return next(d for d in range(max(1, steps // 40), 0, -1) if steps % d == 0)


def run_logged(command: list[str], env: dict, console: Path, timeout_s: float) -> float:
    """Run `command`, appending its output to `console`; returns its wall time. Raises on failure/timeout."""
    with open(console, "a") as log:
        log.write(f"\n$ {shlex.join(command)}\n")
        log.flush()
        start = time.perf_counter()
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   start_new_session=True)
        try:
            status = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            os.killpg(process.pid, 9)  # the torchrun launcher and the workers it started
            process.wait()
            raise RuntimeError(f"timed out after {timeout_s:.0f} s: {shlex.join(command)} (see {console})") \
                from error
        wall = time.perf_counter() - start
        log.write(f"# exit status {status}, {wall:.1f} s\n")
    if status:
        print("".join(console.read_text().splitlines(keepends=True)[-60:]), file=sys.stderr)
        raise RuntimeError(f"exit status {status}: {shlex.join(command)} (see {console})")
    return wall


# ---- report (pure functions of the logs: tested on fake logs) ----

def read_log(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{"step": int(r["step"]), "loss": float(r["loss"]), "tokens": int(r["tokens"]),
                 "elapsed_s": float(r["elapsed_s"])} for r in csv.DictReader(f)]


def steady_throughput(rows: list[dict], start_step: int, end_step: int) -> dict:
    """Tokens/s and steps/s over the log windows ending in (start_step, end_step]; both must be logged steps
    of one process (elapsed_s is measured from that process's start)."""
    by_step = {r["step"]: r for r in rows}
    if start_step not in by_step or end_step not in by_step or end_step <= start_step:
        raise ValueError(f"need logged steps {start_step} < {end_step}, have {sorted(by_step)}")
    seconds = by_step[end_step]["elapsed_s"] - by_step[start_step]["elapsed_s"]
    tokens = sum(r["tokens"] for r in rows if start_step < r["step"] <= end_step)
    return {"tokens_per_s": tokens / seconds, "steps_per_s": (end_step - start_step) / seconds,
            "from_step": start_step, "to_step": end_step}


def measured_from(rows: list[dict], first_step: int, warmup: int) -> int:
    """The first logged step >= first_step + warmup (skips at least one window: compilation, caches)."""
    steps = sorted(r["step"] for r in rows if r["step"] > first_step)
    return next((s for s in steps if s >= first_step + warmup), steps[0])


def summarise(one: list[dict], two: list[dict], resumed: list[dict], steps: int) -> dict:
    """Throughput, scaling efficiency, final losses and the resume check from the three runs' logs."""
    warmup = max(1, steps // 10)
    single = steady_throughput(one, measured_from(one, 0, warmup), steps)
    double = steady_throughput(two, measured_from(two, 0, warmup), steps)
    after = [r for r in resumed if r["step"] > steps]
    if not after:
        raise ValueError(f"the resumed run logged nothing after step {steps}")
    last_two = next(r for r in two if r["step"] == steps)
    resumed_rate = (steady_throughput(after, after[0]["step"], after[-1]["step"]) if len(after) > 1 else None)
    return {
        "steps": steps,
        "one_gpu": {**single, "final_loss": next(r for r in one if r["step"] == steps)["loss"]},
        "two_gpus": {**double, "final_loss": last_two["loss"]},
        "scaling_efficiency": double["tokens_per_s"] / (2 * single["tokens_per_s"]),
        "resumed": {**(resumed_rate or {}), "first_step": after[0]["step"], "final_step": after[-1]["step"],
                    "first_loss": after[0]["loss"], "final_loss": after[-1]["loss"],
                    "continues": after[0]["loss"] <= RESUME_TOLERANCE * last_two["loss"]},
    }


def plot_losses(one: list[dict], two: list[dict], resumed: list[dict], steps: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in one], [r["loss"] for r in one], label="1 GPU")
    ax.plot([r["step"] for r in two], [r["loss"] for r in two], label="2 GPUs (DDP)")
    segment = [r for r in two if r["step"] == steps] + [r for r in resumed if r["step"] > steps]
    ax.plot([r["step"] for r in segment], [r["loss"] for r in segment],
            label="2-GPU checkpoint resumed on 1 GPU")
    ax.axvline(steps, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (target tokens)")
    ax.set_title("MQMTAR, ASEntmax: 1 vs 2 GPUs, same global batch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(summary: dict, setup: dict) -> str:
    s, one, two, res = summary["steps"], summary["one_gpu"], summary["two_gpus"], summary["resumed"]
    rate = lambda row: f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else "-"
    per_s = lambda row: f"{row['steps_per_s']:.2f}" if "steps_per_s" in row else "-"
    span = lambda row: f"{row['from_step']}-{row['to_step']}" if "from_step" in row else "-"
    lines = [
        f"# Data-parallel scaling of `asentmax train` ({setup['label']})", "",
        f"MQMTAR preset model ({setup['n_parameters']:,} parameters), ASEntmax attention, attention backend "
        f"{setup['attention_backend']}, global batch {setup['batch_size']}, {s} steps "
        f"(+{res['final_step'] - s} resumed), git {setup['git_commit']}; device {setup['device']}. "
        "Throughput is steady state: tokens "
        "logged by train.py (non-pad, all ranks) over the elapsed time of the measured steps; the first "
        "tenth of the steps (at least one log window: compilation) is left out. Same schedule in every run; "
        "the 1- and 2-GPU runs draw different shards of the data, so their curves differ by sampling noise.",
        "",
        "| GPUs | measured steps | tokens/s | steps/s | scaling efficiency | final loss | run wall s |",
        "|---|---|---|---|---|---|---|",
        f"| 1 | {span(one)} | {rate(one)} | {per_s(one)} | - | {one['final_loss']:.4f} (step {s}) "
        f"| {setup['wall_s']['one_gpu']:.1f} |",
        f"| 2 | {span(two)} | {rate(two)} | {per_s(two)} | {summary['scaling_efficiency']:.3f} "
        f"| {two['final_loss']:.4f} (step {s}) | {setup['wall_s']['two_gpus']:.1f} |",
        f"| 2 -> 1 (resumed) | {span(res)} | {rate(res)} | {per_s(res)} | - | {res['final_loss']:.4f} "
        f"(step {res['final_step']}) | {setup['wall_s']['resumed']:.1f} |", "",
        "Scaling efficiency = tokens/s(2 GPUs) / (2 x tokens/s(1 GPU)). Run wall time includes start-up "
        "(imports, process group, kernel compilation) and, for the resumed run, the final validation.", "",
        f"Resume: the 2-GPU checkpoint at step {s} (loss {two['final_loss']:.4f}) continued on 1 GPU with "
        f"loss {res['first_loss']:.4f} at step {res['first_step']} and {res['final_loss']:.4f} at step "
        f"{res['final_step']}: {'continues' if res['continues'] else 'DOES NOT CONTINUE'} "
        f"(first resumed loss within {RESUME_TOLERANCE - 1:.0%} of the checkpoint's).", "",
        "![loss curves](loss_curves.png)", "",
        "## Commands", "",
        "Regenerate everything: `" + setup["driver_command"] + "`", "",
        "The runs it made (environment: " + " ".join(f"{k}={v}" for k, v in NO_MULTICAST.items()) + "):", "",
        "```", *setup["commands"], "```", "",
        "## Versions", "",
        *[f"- {key}: {value}" for key, value in setup["versions"].items()], "",
    ]
    return "\n".join(lines)


# ---- driver ----

def versions(device: str) -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton
        found["triton"] = triton.__version__
    except ImportError:
        found["triton"] = "not installed"
    if device == "cuda":
        found["gpus"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        found["cuda"] = torch.version.cuda
        nccl = torch.cuda.nccl.version()
        found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    found["cpu cores"] = os.cpu_count()
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/ddp_scaling"), help="report directory")
    parser.add_argument("--steps", type=int, default=400, help="steps of the 1- and 2-GPU runs")
    parser.add_argument("--resume-steps", type=int, help="steps of the resumed run (default: steps // 4)")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch (the preset's: 128)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo dry run")
    parser.add_argument("--work-dir", type=Path, help="run directories (default: a new temporary directory)")
    parser.add_argument("--run-timeout", type=float, default=160, help="seconds allowed to each run")
    args = parser.parse_args(argv)
    args.resume_steps = args.resume_steps or max(1, args.steps // 4)
    if args.steps < 2 or args.resume_steps < 1 or args.batch_size < 2 or args.batch_size % 2:
        parser.error("need --steps >= 2, --resume-steps >= 1 and an even --batch-size >= 2")

    import torch

    if args.device == "cuda" and torch.cuda.device_count() < 2:
        parser.error(f"--device cuda needs 2 GPUs, found {torch.cuda.device_count()} (use --device cpu)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="ddp_scaling_"))
    work.mkdir(parents=True, exist_ok=True)
    console = args.out / "console.log"
    console.write_text("")
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    dirs = {name: work / name for name in ("one_gpu", "two_gpus", "resumed")}
    for path in dirs.values():
        shutil.rmtree(path, ignore_errors=True)

    commands, wall = [], {}
    for name, nproc in (("one_gpu", 1), ("two_gpus", 2)):
        command = train_command(nproc, dirs[name], args, resume=False)
        print(f"[{name}] {shlex.join(command)}", flush=True)
        wall[name] = run_logged(command, env, console, args.run_timeout)
        commands.append(shlex.join(command))
    shutil.copytree(dirs["two_gpus"], dirs["resumed"])
    command = train_command(1, dirs["resumed"], args, resume=True)
    print(f"[resumed] cp -r {dirs['two_gpus']} {dirs['resumed']} && {shlex.join(command)}", flush=True)
    wall["resumed"] = run_logged(command, env, console, args.run_timeout)
    commands += [f"cp -r {dirs['two_gpus']} {dirs['resumed']}", shlex.join(command)]

    logs = {name: read_log(path / "log.csv") for name, path in dirs.items()}
    summary = summarise(logs["one_gpu"], logs["two_gpus"], logs["resumed"], args.steps)
    config = json.loads((dirs["two_gpus"] / "config.json").read_text())
    world_sizes = [json.loads((dirs[name] / "config.json").read_text())["world_size"] for name in logs]
    if world_sizes != [1, 2, 2]:  # the resumed directory keeps the 2-GPU run's config.json
        raise RuntimeError(f"runs had world sizes {world_sizes}, expected 1, 2 (and its copy)")
    from asentmax.ops.triton import is_available

    backend = "triton" if args.device == "cuda" and is_available() else "chunked (torch)"
    setup = {
        "label": "2 x " + torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU dry run, gloo",
        "n_parameters": config["n_parameters"], "attention_backend": f"auto = {backend}",
        "batch_size": args.batch_size, "git_commit": config["git_commit"], "device": config["device"],
        "wall_s": wall,
        "driver_command": "PYTHONPATH=src python " + shlex.join([
            "benchmarks/bench_ddp_scaling.py", *(sys.argv[1:] if argv is None else argv)]),
        "commands": commands, "versions": versions(args.device)}
    (args.out / "ddp_scaling.json").write_text(json.dumps(
        {"summary": summary, "setup": setup, "train_config": config["train_config"],
         "model_config": config["model_config"]}, indent=2) + "\n")
    with open(args.out / "logs.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["run", "step", "loss", "tokens", "elapsed_s"])
        writer.writeheader()
        writer.writerows({"run": name, **row} for name, rows in logs.items() for row in rows)
    plot_losses(logs["one_gpu"], logs["two_gpus"], logs["resumed"], args.steps, args.out / "loss_curves.png")
    (args.out / "README.md").write_text(markdown(summary, setup))
    print((args.out / "README.md").read_text())
    return 0 if summary["resumed"]["continues"] else 1


if __name__ == "__main__":
    sys.exit(main())
