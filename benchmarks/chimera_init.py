"""Which part of an initial model decides whether a Reverse ASEntmax run generalises? On Reverse the init
seed decides, not the batches (results/paper/reverse.md, "Forty-first session"), and no step-0 measurement
predicts it (benchmarks/init_probe.py). This writes a start checkpoint for `asentmax train --init-from` that
takes a base seed's initial model and replaces the parameters under the given name prefixes, or the token
embedding's rows of the given token ids, by a donor seed's, both drawn as `asentmax train` draws them
(asentmax.trainer.initial_model). Training chimeras of a passing and a failing init (seed 1 and seed 8) then
tells which parameters carry the outcome.

    PYTHONPATH=src python benchmarks/chimera_init.py results/paper/reverse/asentmax_b128_paper_blocks \\
        --base-seed 8 --donor-seed 1 --from-donor embed. head. --out runs/chimera/io1_rest8.pt
    PYTHONPATH=src python benchmarks/chimera_init.py results/paper/reverse/asentmax_b128_paper_blocks \\
        --base-seed 1 --donor-seed 8 --donor-embedding-tokens 0 1 2 3 --out runs/chimera/special8_rest1.pt

RUN_DIR's config.json gives the model. The checkpoint records no training (step 0, 0 samples), so the run
it starts counts its samples from 0. A prefix that names no parameter is refused in one line (exit code 2),
as are prefixes that take every parameter, a token id outside the vocabulary, token rows of an embedding a
prefix already takes whole, and a call that takes nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from asentmax.nn import ModelConfig
from asentmax.runs import CONFIG_NAME, RunError, git_commit, read_json, save_checkpoint
from asentmax.trainer import initial_model

EMBEDDING = "embed.weight"  # the token embedding: a row per token id


def chimera(model_config: ModelConfig, base_seed: int, donor_seed: int, prefixes: list[str],
            embedding_tokens: list[int] = ()) -> tuple[dict, list[str]]:
    """(the base seed's initial state dict with every tensor whose name starts with one of `prefixes`, and the
    token embedding's rows of `embedding_tokens`, taken from the donor seed's; the names of the tensors taken
    whole); ValueError (one line) for a prefix that names nothing, prefixes that take every tensor, a token
    id outside the vocabulary, rows of an embedding taken whole, or nothing to take."""
    if not prefixes and not embedding_tokens:
        raise ValueError("give --from-donor or --donor-embedding-tokens: nothing is taken from the donor")
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
    state = {name: (donor if name in taken else base)[name] for name in base}
    if embedding_tokens:
        if EMBEDDING in taken:
            raise ValueError(f"--donor-embedding-tokens with {EMBEDDING} taken whole by --from-donor")
        vocab = base[EMBEDDING].shape[0]
        outside = [token for token in embedding_tokens if not 0 <= token < vocab]
        if outside:
            raise ValueError(f"--donor-embedding-tokens {outside[0]} is outside the vocabulary "
                             f"(0-{vocab - 1})")
        state[EMBEDDING] = base[EMBEDDING].clone()
        state[EMBEDDING][list(embedding_tokens)] = donor[EMBEDDING][list(embedding_tokens)]
    return state, taken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    parser.add_argument("--base-seed", type=int, required=True)
    parser.add_argument("--donor-seed", type=int, required=True)
    parser.add_argument("--from-donor", nargs="+", default=[], metavar="PREFIX",
                        help="parameter name prefixes taken from the donor seed, e.g. embed. blocks.0.")
    parser.add_argument("--donor-embedding-tokens", nargs="+", type=int, default=[], metavar="TOKEN",
                        help="token ids whose rows of the token embedding are taken from the donor seed")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        config = read_json(args.run_dir / CONFIG_NAME, "run config")
        model_config = ModelConfig.from_dict(config["model_config"])
        state, taken = chimera(model_config, args.base_seed, args.donor_seed, args.from_donor,
                               args.donor_embedding_tokens)
    except (RunError, ValueError) as error:
        print(f"chimera_init: error: {error}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"base_seed": args.base_seed, "donor_seed": args.donor_seed, "from_donor": taken,
              "donor_embedding_tokens": args.donor_embedding_tokens}
    save_checkpoint(args.out, {"model": state, "step": 0, "model_config": asdict(model_config),
                               "train_config": {"batch_size": config["train_config"]["batch_size"]},
                               "git_commit": git_commit(), "chimera": record})
    rows = (f" and {len(args.donor_embedding_tokens)} of {state[EMBEDDING].shape[0]} token embedding rows"
            if args.donor_embedding_tokens else "")
    print(f"{args.out}: seed {args.base_seed}'s init with {len(taken)} of {len(state)} tensors{rows} "
          f"from seed {args.donor_seed}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
