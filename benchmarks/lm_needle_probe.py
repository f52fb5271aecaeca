"""Graded needle retrieval of trained LM runs (issue 16; arXiv:2506.16640, section 5): where exact match
is ~0 %, does the context still raise the needle's value at all?

On the evaluation's own prompts (asentmax.lm.needles, the seeds of `asentmax lm eval`), per task and
length it measures, teacher-forced after the prompt:
  choice %   how often the value the needle states is more likely than another value of as many digits
             drawn at random (a two-way forced choice: 50 % = the context does not help, 100 % = retrieval)
  lift       the mean log-likelihood margin of the stated value over the other one (nats)
  number %   how often the greedy first token starts a number at all (' 5', ' 12', ...)
  first %    how often it is the first token of the stated value

Usage (the lead, on the GPU; CPU works for tiny runs):
  PYTHONPATH=src python benchmarks/lm_needle_probe.py runs/lm/softmax_rope runs/lm/asentmax_nape \
      --data data/lm --out results/lm/needle_probe
writes needle_probe.json and needle_probe.md under --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from asentmax import precision
from asentmax.lm.dataset import Split
from asentmax.lm.needles import TASKS, NeedleBuilder
from asentmax.lm.tokenizer import LMTokenizer
from asentmax.nn import ModelConfig, Transformer
from asentmax.runs import CHECKPOINT_NAME, load_checkpoint


def load_run(run_dir: Path, device: torch.device) -> tuple[Transformer, dict]:
    checkpoint = load_checkpoint(run_dir / CHECKPOINT_NAME, map_location="cpu")
    model = Transformer(ModelConfig.from_dict(checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    return model.to(device).eval(), checkpoint["workload"]


@torch.no_grad()
def answer_logprobs(model, prompt: np.ndarray, answers: list[list[int]], autocast) -> tuple[list[float], int]:
    """Summed log-probabilities of each answer's tokens after `prompt`, and the greedy first token."""
    width = max(len(a) for a in answers)
    rows = torch.zeros(len(answers), len(prompt) + width, dtype=torch.long)
    for r, answer in enumerate(answers):
        rows[r, :len(prompt)] = torch.from_numpy(prompt)
        rows[r, len(prompt):len(prompt) + len(answer)] = torch.tensor(answer)
    device = next(model.parameters()).device
    with autocast:  # right padding: the padded tail is never a key of a scored position
        logits = model(rows[:, :-1].to(device)).float().log_softmax(-1).cpu()
    scores = []
    for r, answer in enumerate(answers):
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(answer))
        scores.append(float(logits[r, positions, torch.tensor(answer)].sum()))
    return scores, int(logits[0, len(prompt) - 1].argmax())


def probe(model, tokenizer, builder, task, length, *, n_samples, seed, autocast) -> dict:
    rng = np.random.default_rng([seed, TASKS.index(task), length])  # the prompts `asentmax lm eval` scores
    other_rng = np.random.default_rng([seed, TASKS.index(task), length, 1])
    texts = tokenizer.token_texts()
    wins, lifts, number, first = 0, [], 0, 0
    for _ in range(n_samples):
        sample = builder.sample(task, length, rng)
        digits = len(sample.answer)
        other = sample.answer
        while other == sample.answer:
            other = str(int(other_rng.integers(10 ** (digits - 1), 10 ** digits)))
        answers = [tokenizer.encode(" " + sample.answer), tokenizer.encode(" " + other)]
        (right, wrong), greedy = answer_logprobs(model, sample.prompt, answers, autocast)
        wins += right > wrong
        lifts.append(right - wrong)
        number += texts[greedy].strip()[:1].isdigit()
        first += greedy == answers[0][0]
    return {"choice": 100.0 * wins / n_samples, "lift": float(np.mean(lifts)),
            "number": 100.0 * number / n_samples, "first": 100.0 * first / n_samples, "samples": n_samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--data", type=Path, required=True, help="the data folder (tokenizer, test.npz)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                        help="as given to `asentmax lm eval` (the S-NIAH-2 haystack depends on the largest)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    autocast = precision.autocast(device, precision.autocast_dtype("auto", device))
    tokenizer = LMTokenizer.load(args.data)
    test = Split.load(args.data / "test.npz")
    documents = [np.asarray(test.document(d)) for d in range(test.n_documents)]
    results, lines = {}, ["| run | task | length | choice % | lift (nats) | number % | first % |",
                          "|---|---|---|---|---|---|---|"]
    for run_dir in args.run_dirs:
        model, workload = load_run(run_dir, device)
        context = int(workload["context"])
        span = max(args.multipliers) * context
        builder = NeedleBuilder(tokenizer, np.concatenate([d[:span + 1] for d in documents]))
        results[str(run_dir)] = {}
        for task in args.tasks:
            for m in sorted(args.multipliers):
                if m * context < builder.min_length(task):
                    continue
                r = probe(model, tokenizer, builder, task, m * context, n_samples=args.samples,
                          seed=args.seed, autocast=autocast)
                results[str(run_dir)][f"{task}/{m}"] = r
                lines.append(f"| {run_dir.name} | {task} | {m}x | {r['choice']:.0f} | {r['lift']:.2f} | "
                             f"{r['number']:.0f} | {r['first']:.0f} |")
                print(lines[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "needle_probe.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "needle_probe.md").write_text("# Needle probe (benchmarks/lm_needle_probe.py)\n\n"
                                              + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
