"""Cost of one training batch of the device sampler (asentmax.tasks.device_sampling, issue 14): ms per batch
(synchronised, the host's numpy step_generator included, as bench_train_gpu.py's "data" column measures
it), the top-level tensor operations the host issues per batch (torch.profiler; views and empty
allocations left out: each of the rest is a kernel launch, or a few inside sort / top-k) and, on CUDA,
the kernels launched and their summed GPU time. Buckets of the MQMTAR training preset
(length_buckets(32, 64, 4)) for every task.

    .venv/bin/python benchmarks/bench_sampler.py                     # CUDA when there is one, else CPU
    .venv/bin/python benchmarks/bench_sampler.py --device cpu --threads 1

Writes OUT.json and OUT.md (default results/sampler_<device type>).
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from asentmax.data import length_buckets
from asentmax.runs import git_commit
from asentmax.tasks import get_task
from asentmax.tasks.device_sampling import DeviceBatchSampler

REPO = Path(__file__).resolve().parents[1]
TASKS = ("mqmtar", "copy", "reverse", "sort")
NOT_LAUNCHES = {"view", "slice", "select", "unsqueeze", "expand", "flatten", "reshape", "as_strided",
                "alias", "_unsafe_view", "detach", "t", "permute", "squeeze", "unbind", "split", "narrow",
                "lift_fresh", "empty", "empty_strided", "result_type", "is_nonzero", "_local_scalar_dense"}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(name: str, device: torch.device, batch_size: int, repeats: int) -> dict:
    sampler = DeviceBatchSampler(get_task(name), length_buckets(32, 64, 4), device)
    for step in range(3):
        sampler.batch(seed=0, rank=0, step=step, batch_size=batch_size)
    times = []
    for step in range(repeats):
        sync(device)
        start = time.perf_counter()
        sampler.batch(seed=0, rank=0, step=step, batch_size=batch_size)
        sync(device)
        times.append(time.perf_counter() - start)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        sampler.batch(seed=0, rank=0, step=repeats, batch_size=batch_size)
        sync(device)
    events = prof.events()
    top = [e.name.removeprefix("aten::") for e in events if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    row = {"task": name, "batch": batch_size, "ms": statistics.median(times) * 1e3,
           "host_ops": sum(op not in NOT_LAUNCHES for op in top)}
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        row["kernels"] = len(kernels)
        row["kernel_us"] = sum(e.device_time for e in kernels)
    return row


def write(out: Path, meta: dict, rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    cuda = "kernels" in rows[0]
    lines = [f"# Device sampler: cost per training batch ({meta['device']})", "",
             f"Command: `{meta['command']}`  ", f"torch {meta['torch']}; git {meta['git']}; "
             f"threads {meta['threads']}; buckets length_buckets(32, 64, 4)", "",
             "| task | batch | ms / batch | samples/s | host ops |"
             + (" kernels | kernel µs |" if cuda else ""),
             "|---|---|---|---|---|" + ("---|---|" if cuda else "")]
    for r in rows:
        line = (f"| {r['task']} | {r['batch']} | {r['ms']:.3f} | {r['batch'] / r['ms'] * 1e3:,.0f} | "
                f"{r['host_ops']} |")
        lines.append(line + (f" {r['kernels']} | {r['kernel_us']:.0f} |" if cuda else ""))
    lines += ["", "ms / batch: median wall time of one synchronised `DeviceBatchSampler.batch`; host ops: "
              "top-level aten operations of one batch that are not views (torch.profiler)"
              + ("; kernels / kernel µs: CUDA kernels of one batch and their summed device time." if cuda
                 else "."), ""]
    out.with_suffix(".md").write_text("\n".join(lines))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu)")
    if args.threads:
        torch.set_num_threads(args.threads)
    tasks = args.tasks.split(",")
    for name in tasks:
        if name not in TASKS:
            parser.error(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    out = args.out or REPO / "results" / f"sampler_{device.type}"
    commit = git_commit()  # $ASENTMAX_GIT_COMMIT on a copied tree, whose git metadata is stale
    meta = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "torch": torch.__version__,
            "git": commit, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU ({platform.machine()})"}
    rows = [measure(name, device, args.batch_size, args.repeats) for name in tasks]
    write(out, meta, rows)
    print(out.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
