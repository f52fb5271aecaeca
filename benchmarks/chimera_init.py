"""Which part of an initial model decides whether a Reverse ASEntmax run generalises? On Reverse the init
seed decides, not the batches (results/paper/reverse.md, "Forty-first session"), and no step-0 measurement
predicts it (benchmarks/init_probe.py). This writes a start checkpoint for `asentmax train --init-from` that
takes a base seed's initial model and replaces the parameters under the given name prefixes by a donor seed's,
both drawn as `asentmax train` draws them (asentmax.trainer.initial_model). Training chimeras of a passing and
a failing init (seed 1 and seed 8) then tells which parameters carry the outcome.

    PYTHONPATH=src python benchmarks/chimera_init.py results/paper/reverse/asentmax_b128_paper_blocks \\
        --base-seed 8 --donor-seed 1 --from-donor embed. head. final_norm. --out runs/chimera/io1_rest8.pt

RUN_DIR's config.json gives the model. The checkpoint records no training (step 0, 0 samples), so the run
it starts counts its samples from 0. A prefix that names no parameter is refused in one line (exit code 2),
as are prefixes that take every parameter.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from asentmax.nn import ModelConfig
from asentmax.runs import CONFIG_NAME, RunError, git_commit, read_json, save_checkpoint
from asentmax.trainer import initial_model


def chimera(model_config: ModelConfig, base_seed: int, donor_seed: int,
            prefixes: list[str]) -> tuple[dict, list[str]]:
    """(the base seed's initial state dict with every tensor whose name starts with one of `prefixes` taken
    from the donor seed's, the names taken); ValueError (one line) for a prefix that names nothing, or for
    prefixes that take every tensor."""
    base = initial_model(model_config, base_seed).state_dict()
    donor = initial_model(model_config, donor_seed).state_dict()
    for prefix in prefixes:
        if not any(name.startswith(prefix) for name in base):
            starts = ", ".join(sorted({name.split(".")[0] + "." for name in base}))
            raise ValueError(f"--from-donor {prefix!r} names no parameter of this model (its names start "
                             f"with {starts})")
    taken = [name for name in base if name.startswith(tuple(prefixes))]
    if len(taken) == len(base):
        raise ValueError("--from-donor takes every parameter: that is the donor seed's own init")
    return {name: (donor if name in taken else base)[name] for name in base}, taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--base-seed", type=int, required=True)
    parser.add_argument("--donor-seed", type=int, required=True)
    parser.add_argument("--from-donor", nargs="+", required=True, metavar="PREFIX",
                        help="parameter name prefixes taken from the donor seed, e.g. embed. blocks.0.")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        config = read_json(args.run_dir / CONFIG_NAME, "run config")
        model_config = ModelConfig.from_dict(config["model_config"])
        state, taken = chimera(model_config, args.base_seed, args.donor_seed, args.from_donor)
    except (RunError, ValueError) as error:
        print(f"chimera_init: error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"base_seed": args.base_seed, "donor_seed": args.donor_seed, "from_donor": taken}
    save_checkpoint(args.out, {"model": state, "step": 0, "model_config": asdict(model_config),
                               "train_config": {"batch_size": config["train_config"]["batch_size"]},
                               "git_commit": git_commit(), "chimera": record})
    print(f"{args.out}: seed {args.base_seed}'s init with {len(taken)} of {len(state)} tensors from seed "
          f"{args.donor_seed}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
