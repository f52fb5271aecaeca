"""Does a trained LM answer a needle question with a number at all (issue 16; arXiv:2506.16640, section 5)?

On the prompts `asentmax lm eval --seed S` scores (asentmax.lm.evaluate.retrieval_accuracy's draws), per
task and length: the share of greedy completions (10 tokens) that start with digits, right or wrong, next
to the exact match. It tells a model that has learned the answer format but not to copy the value (digits
%, no exact match) from one that has learned neither (results/lm/retrieval_share_cpu.md).

Usage (on the CPU, for small models):
  PYTHONPATH=src python benchmarks/lm_answer_format.py RUN [RUN ...] --data DATA
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from lm_needle_probe import load_run

from asentmax.lm.dataset import Split
from asentmax.lm.needles import TASKS, NeedleBuilder, leading_digits
from asentmax.lm.tokenizer import LMTokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--data", type=Path, required=True, help="the data folder (tokenizer, test.npz)")
    parser.add_argument("--multipliers", type=int, nargs="+", default=[1, 2],
                        help="as given to `asentmax lm eval` (the S-NIAH-2 haystack depends on the largest)")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = LMTokenizer.load(args.data)
    test = Split.load(args.data / "test.npz")
    documents = [np.asarray(test.document(d)) for d in range(test.n_documents)]
    print("| run | task | length | digits % | exact % |\n|---|---|---|---|---|")
    for run_dir in args.run_dirs:
        model, workload = load_run(run_dir, torch.device("cpu"))
        context = int(workload["context"])
        span = max(args.multipliers) * context
        builder = NeedleBuilder(tokenizer, np.concatenate([d[:span + 1] for d in documents]))
        for task in TASKS:
            for m in sorted(args.multipliers):
                if m * context < builder.min_length(task):
                    continue
                rng = np.random.default_rng([args.seed, TASKS.index(task), m * context])
                samples = [builder.sample(task, m * context, rng) for _ in range(args.samples)]
                with torch.no_grad():
                    out = model.generate(torch.from_numpy(np.stack([s.prompt for s in samples])), 10)
                digits = [leading_digits(tokenizer.decode(row)) for row in out[:, m * context:].tolist()]
                number = 100 * np.mean([d != "" for d in digits])
                exact = 100 * np.mean([d == s.answer for d, s in zip(digits, samples, strict=True)])
                print(f"| {run_dir.name} | {task} | {m}x | {number:.0f} | {exact:.0f} |", flush=True)


if __name__ == "__main__":
    main()
