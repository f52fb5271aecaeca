"""Why ASEntmax stalls on the MQMTAR loss plateau: many short training runs side by side on one GPU.

Each run is one `asentmax train` child process (the MQMTAR preset with a few flags changed); all runs of
a study start together and share the GPU (each is launch-bound, so they interleave) until `--seconds`
have passed, then they are stopped. The loss curves in the runs' log.csv give, per run, the first step
at which the training loss falls below `--escape-loss` (the plateau sits near 0.6 nats per target token;
a model that has learned the retrieval is far below 0.1). Writes under --out:

    plateau.json   per run: flags, steps reached, steps/s, steps to escape (null = never), loss curve
    plateau.md     the table, with the command
    plateau.png    training loss against step, one line per run

Usage (one H200):  PYTHONPATH=src python benchmarks/plateau_study.py --out $OUT/plateau --seconds 480
CPU scale (a small model, many seeds; results/paper/plateau/cpu_scale.md), two runs at a time:
                   PYTHONPATH=src python benchmarks/plateau_study.py --study cpu --out /tmp/cpu \
                       --work /tmp/cpu_runs --steps 1500 --parallel 2 --seconds 100000 --escape-loss 0.5
CPU smoke test:    PYTHONPATH=src python benchmarks/plateau_study.py --out /tmp/p --seconds 20 --smoke
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import time
from pathlib import Path

from device_plan import run_together  # the one side-by-side runner

# name -> flags added to `asentmax train --preset mqmtar`; the candidate causes of the plateau: the
# initialisation of the beta/gamma projections, warm-up, learning rate, theta's offset delta, the
# normaliser itself (entmax without a temperature; softmax as the escape reference) and batch size.
STUDIES = {
    "causes": {
        "softmax": ["--attention", "softmax"],
        "entmax": ["--attention", "entmax"],
        "asentmax": ["--attention", "asentmax"],
        "asentmax_seed1": ["--attention", "asentmax", "--seed", "1"],
        "asentmax_reference_init": ["--attention", "asentmax", "--asentmax-init", "reference"],
        "asentmax_delta0": ["--attention", "asentmax", "--theta-delta", "0"],
        "asentmax_lr5e-4": ["--attention", "asentmax", "--lr", "5e-4"],
        "asentmax_lr1e-3": ["--attention", "asentmax", "--lr", "1e-3"],
        "asentmax_warmup250": ["--attention", "asentmax", "--warmup-steps", "250"],
        "asentmax_batch512_lr4e-4": ["--attention", "asentmax", "--batch-size", "512", "--lr", "4e-4"],
    },
    # the first study left seed dependence and the learned temperature as the lead: three seeds of the
    # default against the temperature projections learning later (delay) or slower (lr scale)
    "seeds": {
        **{f"asentmax_seed{s}": ["--attention", "asentmax", "--seed", str(s)] for s in (0, 2, 3)},
        **{f"asentmax_delay2000_seed{s}": ["--attention", "asentmax", "--seed", str(s),
                                           "--temperature-delay-steps", "2000"] for s in (0, 2, 3)},
        **{f"asentmax_tlr0.1_seed{s}": ["--attention", "asentmax", "--seed", str(s),
                                        "--temperature-lr-scale", "0.1"] for s in (0, 2, 3)},
        "softmax_seed2": ["--attention", "softmax", "--seed", "2"],
    },
    # next on the GPU (results/paper/plateau/cpu_scale.md, not yet run): is entmax's stall rate ASEntmax's
    # (sparse attention in general), and does a denser alpha (1.25) let the stalled seeds 0 and 2 escape?
    "sparsity": {
        **{f"entmax_seed{s}": ["--attention", "entmax", "--seed", str(s)] for s in range(4)},
        **{f"asentmax_alpha1.25_seed{s}": ["--attention", "asentmax", "--seed", str(s), "--alpha", "1.25"]
           for s in range(4)},
        "softmax_seed0": ["--attention", "softmax", "--seed", "0"],
    },
    # the same question at CPU scale (STUDY_FLAGS["cpu"]), where seeds are cheap: is the escape a lottery
    # of ASEntmax's seed that softmax does not play, and is entmax (no temperature) like ASEntmax?
    "cpu": {f"{method}_seed{s}": ["--attention", method, "--seed", str(s)]
            for s in range(8) for method in ("softmax", "asentmax")}
           | {f"entmax_seed{s}": ["--attention", "entmax", "--seed", str(s)] for s in range(4)},
}
# the cpu study's model and data (results/paper/plateau/cpu_scale.md): a small NAPE model on one CPU core
# per run, so that many seeds are cheap; added to every run of that study after the preset
STUDY_FLAGS = {"cpu": ["--device", "cpu", "--sampling", "host", "--d-model", "128", "--n-layers", "2",
                       "--n-heads", "4", "--d-ff", "256", "--batch-size", "32", "--min-length", "8",
                       "--max-length", "24", "--lr", "1e-3", "--warmup-steps", "200", "--min-lr-ratio", "1"]}
SMOKE_FLAGS = ["--device", "cpu", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
               "--batch-size", "8", "--min-length", "6", "--max-length", "12"]


def train_command(name: str, flags: list[str], work: Path, steps: int, smoke: bool,
                  extra: list[str]) -> list[str]:
    """The `asentmax train` arguments of one run of the study: batch 128, warm-up 1,000, cosine to 0.1 of the
    peak and seed 0 unless named, the settings of the committed studies (results/paper/plateau), pinned here
    since the MQMTAR preset itself changed (tenth session: warm-up 3,200, cosine to 0, seed 1)."""
    return ["train", "--preset", "mqmtar", "--run-dir", str(work / name), "--overwrite", "--no-progress",
            "--batch-size", "128", "--steps", str(steps), "--warmup-steps", "1000", "--min-lr-ratio", "0.1",
            "--seed", "0", "--log-every", "25", "--val-every", "0",
            "--checkpoint-every", str(steps)] + (SMOKE_FLAGS if smoke else []) + extra + flags


def run_in_groups(commands: dict[str, list[str]], work: Path, seconds: float, parallel: int | None) -> None:
    """run_together over `parallel` runs at a time (all at once when None); `seconds` bounds each group."""
    names = list(commands)
    size = parallel or len(names)
    for i in range(0, len(names), size):
        run_together({n: commands[n] for n in names[i:i + size]}, work, "train", time.time() + seconds)


def read_curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """(step, loss, elapsed_s) rows of a run's log.csv (empty when it logged nothing)."""
    path = run_dir / "log.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [(int(r["step"]), float(r["loss"]), float(r["elapsed_s"])) for r in csv.DictReader(f)]


def steps_to_escape(curve, threshold: float) -> int | None:
    """First logged step whose window loss is below `threshold` (None when the run never got there)."""
    return next((step for step, loss, _ in curve if loss < threshold), None)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for name, r in results.items():
        if r["curve"]:
            steps = [row[0] for row in r["curve"]]
            losses = [row[1] for row in r["curve"]]
            baseline = not name.startswith("asentmax")
            ax.plot(steps, losses, label=name, lw=1.2, ls="--" if baseline else "-")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss per target token")
    ax.set_title("MQMTAR: leaving the loss plateau")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="plateau.{json,md,png} go here")
    parser.add_argument("--work", type=Path, default=Path("runs/plateau"),
                        help="run directories and their console logs (kept out of --out)")
    parser.add_argument("--study", choices=sorted(STUDIES), default="causes")
    parser.add_argument("--only", nargs="+", help="run only these names of the study")
    parser.add_argument("--seconds", type=float, default=480, help="wall time of the study")
    parser.add_argument("--steps", type=int, default=20000, help="schedule length of each run")
    parser.add_argument("--escape-loss", type=float, default=0.3)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU runs (tests the script)")
    parser.add_argument("--train-flags", default="", help="extra `asentmax train` flags for every run")
    parser.add_argument("--parallel", type=int, help="runs at a time (default: all at once)")
    parser.add_argument("--no-run", action="store_true",
                        help="train nothing: tabulate and plot the runs already in --work")
    args = parser.parse_args()
    if args.parallel is not None and args.parallel < 1:
        parser.error(f"--parallel must be >= 1, got {args.parallel}")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    runs = {k: v for k, v in STUDIES[args.study].items() if not args.only or k in args.only}
    extra = STUDY_FLAGS.get(args.study, []) + shlex.split(args.train_flags)
    if not args.no_run:
        run_in_groups({name: train_command(name, flags, args.work, args.steps, args.smoke, extra)
                       for name, flags in runs.items()}, args.work, args.seconds, args.parallel)
    results = {}
    for name, flags in runs.items():
        curve = read_curve(args.work / name)
        last = curve[-1] if curve else (0, float("nan"), 0.0)
        results[name] = {"flags": flags, "steps": last[0], "final_loss": last[1],
                         "steps_per_s": round(last[0] / last[2], 2) if last[2] else None,
                         "escape_step": steps_to_escape(curve, args.escape_loss), "curve": curve}
    command = "PYTHONPATH=src python benchmarks/plateau_study.py " + shlex.join(sys.argv[1:])
    (args.out / "plateau.json").write_text(json.dumps({"command": command, "seconds": args.seconds,
                                                        "escape_loss": args.escape_loss,
                                                        "runs": results}, indent=1) + "\n")
    together = (f"{args.parallel} runs at a time, each group stopped after" if args.parallel else
                "All runs side by side on one device for")
    lines = [f"# MQMTAR plateau study ({args.study})", "", f"Command: `{command}`", "",
             f"{together} {args.seconds:.0f} s; escape = first logged step with "
             f"training loss < {args.escape_loss}.", "",
             "| run | flags | steps reached | steps/s | escape step | last loss |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        escape = r["escape_step"] if r["escape_step"] is not None else "not yet"
        lines.append(f"| {name} | `{' '.join(r['flags'])}` | {r['steps']} | {r['steps_per_s']} | "
                     f"{escape} | {r['final_loss']:.3f} |")
    (args.out / "plateau.md").write_text("\n".join(lines) + "\n")
    plot(results, args.out / "plateau.png")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
