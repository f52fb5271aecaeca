"""Bring a finished run's weights back from the device machine and carry them into the next call.

The device machine loses its files when it goes cold (about 30 s after a call), returns at most 8 files
of 16 MiB from $OUT, and carries at most 64 MiB of ignored paths into a call (results/session17_gpu: a lost
MQMTAR preset run had to be trained again). A finished run needs no optimizer state: its checkpoint without
it (the MQMTAR preset: 42.7 MB instead of 128 MB) is enough for `asentmax eval` and for `asentmax train
--init-from`.

    PYTHONPATH=src python benchmarks/carry_checkpoint.py pack RUN_DIR OUT_DIR [--part-mb 15] [--bf16-linear]
    PYTHONPATH=src python benchmarks/carry_checkpoint.py unpack PARTS_DIR RUN_DIR

pack writes OUT_DIR/<run>.pt.part000, part001, ... and OUT_DIR/<run>.sha256 (the hash of the whole file);
unpack joins the parts into RUN_DIR/checkpoint.pt and checks the hash. pack refuses a run that has not reached
its planned steps (resuming it would need the optimizer state). Errors are one line, exit code 2.

The 64 MiB carried into a call include the working tree (32.5 MB in the fifty-second session), so the MQMTAR
preset's 43 MB no longer fit. `--bf16-linear` stores the weights of the model's nn.Linear layers in bf16
(about 22 MB for the MQMTAR models: 21.9 for the dense-start recipe's; a weight an Embedding shares, a tied
head, stays as it is). bf16 autocast casts exactly those weights to bf16 before every product, so evaluating
under it (`asentmax eval` on CUDA) gives the same outputs bit for bit; loaded into an fp32 model otherwise (an
fp32 evaluation, an --init-from start) they are the originals rounded to bf16 (relative error below 2^-8).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
from pathlib import Path

import torch

from asentmax.nn import ModelConfig, Transformer
from asentmax.runs import CHECKPOINT_NAME, RunError, load_checkpoint

DROPPED = ("optimizer", "scheduler", "rank_states")  # what only --resume reads


def linear_weight_names(model_config: dict) -> set[str]:
    """The state-dict names of the weights of the model's nn.Linear layers that no other module shares."""
    model = Transformer(ModelConfig.from_dict(model_config))
    shared = {id(p) for module in model.modules() if not isinstance(module, torch.nn.Linear)
              for p in module.parameters(recurse=False)}
    return {f"{name}.weight" for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and id(module.weight) not in shared}


def pack(run_dir: Path, out_dir: Path, part_mb: float, bf16_linear: bool = False) -> list[Path]:
    """Write the finished run's checkpoint without its resume state as parts of at most `part_mb` MB (with
    bf16_linear, its nn.Linear weights in bf16)."""
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
    state = {key: value for key, value in state.items() if key not in DROPPED}
    if bf16_linear:
        names = linear_weight_names(state["model_config"])
        state["model"] = {key: value.to(torch.bfloat16) if key in names else value
                          for key, value in state["model"].items()}
    buffer = io.BytesIO()
    torch.save(state, buffer)
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
    p.add_argument("--bf16-linear", action="store_true",
                   help="the nn.Linear weights in bf16 (half the size; exact under bf16 autocast)")
    u = sub.add_parser("unpack", help="join the parts into RUN_DIR/checkpoint.pt")
    u.add_argument("parts_dir", type=Path)
    u.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            parts = pack(args.run_dir, args.out_dir, args.part_mb, args.bf16_linear)
            print(f"{args.run_dir}: {len(parts)} parts in {args.out_dir}")
        else:
            print(f"wrote {unpack(args.parts_dir, args.run_dir)}")
    except SystemExit as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
