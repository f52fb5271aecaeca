"""Bring a finished run's weights back from the device machine and carry them into the next call.

The device machine loses its files when it goes cold (about 30 s after a call), returns at most 8 files
of 16 MiB from $OUT, and carries at most 64 MiB of ignored paths into a call (results/session17_gpu: a lost
MQMTAR preset run had to be trained again). A finished run needs no optimizer state: its checkpoint without
it (the MQMTAR preset: 42.7 MB instead of 128 MB) is enough for `asentmax eval` and for `asentmax train
--init-from`.

    PYTHONPATH=src python benchmarks/carry_checkpoint.py pack RUN_DIR OUT_DIR [--part-mb 15]
    PYTHONPATH=src python benchmarks/carry_checkpoint.py unpack PARTS_DIR RUN_DIR

pack writes OUT_DIR/<run>.pt.part000, part001, ... and OUT_DIR/<run>.sha256 (the hash of the whole file);
unpack joins the parts into RUN_DIR/checkpoint.pt and checks the hash. pack refuses a run that has not reached
its planned steps (resuming it would need the optimizer state). Errors are one line, exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
from pathlib import Path

import torch

from asentmax.runs import CHECKPOINT_NAME, RunError, load_checkpoint

DROPPED = ("optimizer", "scheduler", "rank_states")  # what only --resume reads


def pack(run_dir: Path, out_dir: Path, part_mb: float) -> list[Path]:
    """Write the finished run's checkpoint without its resume state as parts of at most `part_mb` MB."""
    if part_mb <= 0:
        raise SystemExit(f"--part-mb must be > 0, got {part_mb}")
    try:
        state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    except RunError as error:
        raise SystemExit(str(error)) from None
    planned = (state.get("train_config") or {}).get("steps")
    if planned is None or state["step"] < planned:
        raise SystemExit(f"{run_dir}: at step {state['step']} of {planned}: not finished, and resuming it "
                         "needs the optimizer state this would drop")
    buffer = io.BytesIO()
    torch.save({key: value for key, value in state.items() if key not in DROPPED}, buffer)
    data = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    size = int(part_mb * 1e6)
    parts = []
    for index, start in enumerate(range(0, len(data), size)):
        part = out_dir / f"{run_dir.name}.pt.part{index:03d}"
        part.write_bytes(data[start:start + size])
        parts.append(part)
    (out_dir / f"{run_dir.name}.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    return parts


def unpack(parts_dir: Path, run_dir: Path) -> Path:
    """Join <run>.pt.part* from `parts_dir` into run_dir/checkpoint.pt, checked against <run>.sha256."""
    digest_file = parts_dir / f"{run_dir.name}.sha256"
    parts = sorted(parts_dir.glob(f"{run_dir.name}.pt.part*"))
    if not digest_file.is_file() or not parts:
        raise SystemExit(f"{parts_dir}: no {run_dir.name}.sha256 and {run_dir.name}.pt.part* (from pack)")
    data = b"".join(part.read_bytes() for part in parts)
    if hashlib.sha256(data).hexdigest() != digest_file.read_text().strip():
        raise SystemExit(f"{parts_dir}: the {len(parts)} parts of {run_dir.name} do not match its sha256 "
                         "(a part missing or cut)")
    if not run_dir.is_dir():
        raise SystemExit(f"{run_dir}: not a run directory (unpack the run's other files there first)")
    target = run_dir / CHECKPOINT_NAME
    target.write_bytes(data)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="a finished run's checkpoint without its resume state, in parts")
    p.add_argument("run_dir", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--part-mb", type=float, default=15.0, help="largest part, in MB (default 15)")
    u = sub.add_parser("unpack", help="join the parts into RUN_DIR/checkpoint.pt")
    u.add_argument("parts_dir", type=Path)
    u.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            parts = pack(args.run_dir, args.out_dir, args.part_mb)
            print(f"{args.run_dir}: {len(parts)} parts in {args.out_dir}")
        else:
            print(f"wrote {unpack(args.parts_dir, args.run_dir)}")
    except SystemExit as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
