"""Does anything measurable in a run's initial weights tell whether it will train to generalise? For runs of
one recipe that differ in their init seed, this rebuilds each seed's initial model on the CPU (exactly as
`asentmax train` draws it: asentmax.trainer.initial_model) and measures it before any training:

- per layer and head, at the answer queries of a teacher-forced pass over the first --samples of the run's own
  validation set at each --multipliers length (asentmax.eval.answer_dispersion): the support size (keys with
  p > 0) and theta, the inverse temperature (ASEntmax's delta + beta log(n + 1)^gamma, arXiv:2506.16640,
  section 2);
- the mean cross-entropy there, and the gradient norm of every parameter tensor at the first of those lengths.

Each seed's outcome is whether its validation exact match at --label-length tokens and step --label-step
(val.csv) reached --screen-score: on Reverse every tested run that passed that step-4,000 screen reached 85 %
or more at 4x, every other 75 % or less (results/paper/reverse.md, benchmarks/early_screen.py). Each
measurement's AUC (how often a kept seed measures above a stopped one) is computed on the seeds below
--held-out-from and, as a check, on the seeds from it. The permutation line gives the best |AUC - 0.5| that
labels shuffled among the first group reach over all measurements (its 95th percentile over --permutations
shuffles): only a measurement above it, and holding on the second group, says more than the number of
measurements tried.

    PYTHONPATH=src python benchmarks/init_probe.py results/paper/reverse/asentmax_b128_paper_blocks \\
        results/paper/reverse/asentmax_b128_paper_blocks_seed{0,2,3,7,8,10} \\
        results/paper/reverse/asentmax_b128_paper_blocks_seed{4,5,6,9,11,12,13,14,15,16,17,18}_stalled \\
        results/paper/reverse/asentmax_b128_paper_blocks_seed{19,20}_unfinished \\
        --held-out-from 13 --out results/paper/reverse/init_probe

Every RUN_DIR needs config.json and val.csv; runs must share the model and the workload (one line, exit code
2, otherwise); a second run of a seed already given is skipped. Writes DIR/init_probe.json and .md.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from asentmax.data import IGNORE_INDEX, collate
from asentmax.eval import answer_dispersion
from asentmax.nn import ModelConfig
from asentmax.runs import (
    CONFIG_NAME,
    EVAL_NAME,
    VAL_NAME,
    RunError,
    load_evaluation,
    read_json,
    validation_exact_match,
    write_json,
    write_text,
)
from asentmax.tasks import make_eval_set
from asentmax.train import workload_from_dict
from asentmax.trainer import TrainConfig, initial_model

NAME = "init_probe"


class ProbeError(ValueError):
    """A user's mistake, reported in one line."""


def auc(values: list[float], kept: list[bool]) -> float | None:
    """P(a kept seed's value > a stopped seed's), ties counting one half (the Mann-Whitney U over the pairs);
    None without both kinds of seed."""
    high = [v for v, k in zip(values, kept, strict=True) if k]
    low = [v for v, k in zip(values, kept, strict=True) if not k]
    if not high or not low:
        return None
    wins = sum(1.0 if h > lo else 0.5 if h == lo else 0.0 for h in high for lo in low)
    return wins / (len(high) * len(low))


def shuffled_p(values: list[float], kept: list[bool], permutations: int, seed: int = 0) -> float:
    """The share of `permutations` shuffles of `kept` whose AUC lies at least as far from 0.5 as the real
    one."""
    rng = random.Random(seed)
    observed = abs(auc(values, kept) - 0.5)
    shuffled, hits = kept[:], 0
    for _ in range(permutations):
        rng.shuffle(shuffled)
        hits += abs(auc(values, shuffled) - 0.5) >= observed - 1e-12
    return hits / permutations


def chance_separation(features: dict[str, list[float]], kept: list[bool], permutations: int,
                      seed: int = 0) -> float:
    """The 95th percentile, over `permutations` shuffles of `kept`, of the best |AUC - 0.5| over
    `features`."""
    rng = random.Random(seed)
    best = []
    for _ in range(permutations):
        shuffled = kept[:]
        rng.shuffle(shuffled)
        best.append(max(abs(auc(values, shuffled) - 0.5) for values in features.values()))
    best.sort()
    return best[min(len(best) - 1, int(0.95 * len(best)))]


def read_runs(run_dirs: list[Path], label_step: int, label_length: int) -> list[dict]:
    """One record per init seed (the first run of each): seed, its config, the validation exact match at
    (label_step, label_length) and eval.json's rows where it has them."""
    records, recipe = {}, None
    for run_dir in run_dirs:
        if not (run_dir / CONFIG_NAME).is_file() or not (run_dir / VAL_NAME).is_file():
            raise ProbeError(f"{run_dir} has no {CONFIG_NAME} and {VAL_NAME}: not a run directory")
        config = read_json(run_dir / CONFIG_NAME, "run config")
        this = (config["model_config"], config["workload"])
        if recipe is None:
            recipe = (this, run_dir)
        elif this != recipe[0]:
            raise ProbeError(f"{run_dir} has another model or workload than {recipe[1]}: "
                             "give runs of one recipe")
        screen = validation_exact_match(run_dir).get((label_step, label_length))
        if screen is None:
            raise ProbeError(f"{run_dir / VAL_NAME} has no validation at step {label_step}, "
                             f"length {label_length}")
        train_config = TrainConfig.from_dict(config["train_config"])
        test = load_evaluation(run_dir)["rows"] if (run_dir / f"{EVAL_NAME}.json").is_file() else None
        records.setdefault(train_config.seed, {"run": run_dir.name, "seed": train_config.seed,
                                               "data_seed": train_config.batch_seed(), "screen": screen,
                                               "test": test, "config": config})
    return sorted(records.values(), key=lambda r: r["seed"])


def measure(record: dict, multipliers: list[int], samples: int) -> dict[str, float]:
    """The measurements of one seed's initial model (module docstring), named e.g. "support L0H3 4x"."""
    config = record["config"]
    model_config = ModelConfig.from_dict(config["model_config"])
    workload = workload_from_dict(config["workload"])
    task = workload.task_object
    model = initial_model(model_config, record["seed"]).eval()
    out = {}
    for index, multiplier in enumerate(multipliers):
        # the run's own validation set at this length (TaskWorkload.validate's seed)
        length = workload.max_length * multiplier
        examples = make_eval_set(task, length, samples, seed=record["data_seed"] + 1)
        dispersion = answer_dispersion(model, task, examples, device=torch.device("cpu"))
        for name, key in (("support", "support_size_per_head"), ("theta", "theta_per_head")):
            for layer, heads in enumerate(dispersion[key]):
                for head, value in enumerate(heads):
                    out[f"{name} L{layer}H{head} {multiplier}x"] = float(value)
            every = [value for heads in dispersion[key] for value in heads]
            out[f"{name} mean {multiplier}x"] = sum(every) / len(every)
        batch = collate(task, examples)
        with torch.enable_grad() if index == 0 else torch.no_grad():
            logits = model(batch.input_ids)
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch.labels.flatten(),
                                   ignore_index=IGNORE_INDEX)
            out[f"loss {multiplier}x"] = float(loss.detach())
            if index == 0:
                loss.backward()
                for name, parameter in model.named_parameters():
                    if parameter.grad is not None:
                        out[f"grad norm {name}"] = float(parameter.grad.norm())
    return out


def value_columns(values: list[float], kept: list[bool], digits: int) -> str:
    """The report's last two columns: every kept seed's value, then the stopped seeds' range, to `digits`
    significant digits."""
    kept_values = ", ".join(f"{v:.{digits}g}" for v, k in zip(values, kept, strict=True) if k)
    stopped = sorted(v for v, k in zip(values, kept, strict=True) if not k)
    return f"{kept_values} | {stopped[0]:.{digits}g} to {stopped[-1]:.{digits}g}"


def report(records: list[dict], measurements: list[dict[str, float]], held_out_from: int, permutations: int,
           label: str, screen_score: float, top: int) -> tuple[str, dict]:
    """init_probe.md's text and init_probe.json's content."""
    kept = [r["screen"] >= screen_score for r in records]
    first = [i for i, r in enumerate(records) if r["seed"] < held_out_from]
    second = [i for i, r in enumerate(records) if r["seed"] >= held_out_from]
    names = sorted(set.intersection(*(set(m) for m in measurements)))
    table = {name: [m[name] for m in measurements] for name in names}

    def auc_on(indices, name):
        return auc([table[name][i] for i in indices], [kept[i] for i in indices])

    scored = [(name, auc_on(first, name), auc_on(second, name)) for name in names]
    usable = [s for s in scored if s[1] is not None]
    if not usable:
        raise ProbeError(f"the seeds below {held_out_from} are all kept or all stopped: no AUC to compute")
    usable.sort(key=lambda s: -abs(s[1] - 0.5))
    chance = chance_separation({n: [table[n][i] for i in first] for n in names}, [kept[i] for i in first],
                               permutations)
    lines = [f"| seed | run | {label} | kept (>= {100 * screen_score:g} %) | "
             "test (exact match % by length) |",
             "|---|---|---|---|---|"]
    for record, k in zip(records, kept, strict=True):
        test = ", ".join(f"{r['length']}: {100 * r['exact_match']:.1f}" for r in record["test"]) \
            if record["test"] else "not tested"
        lines.append(f"| {record['seed']} | {record['run']} | {100 * record['screen']:.1f} | "
                     f"{'yes' if k else 'no'} | {test} |")
    n_first = sum(kept[i] for i in first), len(first)
    n_second = sum(kept[i] for i in second), len(second)
    lines += ["", f"{len(names)} measurements of each initial model. AUC: P(a kept seed measures above a "
              f"stopped one), on seeds below {held_out_from} ({n_first[0]} kept of {n_first[1]}) and on the "
              f"rest ({n_second[0]} kept of {n_second[1]}). Shuffled labels on the first group reach a best "
              f"|AUC - 0.5| of {chance:.3f} (95th percentile of {permutations} shuffles).", "",
              f"| measurement | AUC, seeds < {held_out_from} | AUC, seeds >= {held_out_from} | "
              "kept seeds' values | stopped seeds' values |", "|---|---|---|---|---|"]
    for name, first_auc, second_auc in usable[:top]:
        lines.append(f"| {name} | {first_auc:.3f} | {'-' if second_auc is None else f'{second_auc:.3f}'} | "
                     f"{value_columns(table[name], kept, 3)} |")
    whole = [name for name in names if name.startswith("loss ") or " mean " in name]
    lines += ["", "Model-wide measurements (the loss; support and theta averaged over every layer and head), "
              f"few enough to test one by one: AUC over all {len(records)} seeds and p, the share of "
              f"{permutations} shuffles of the labels whose AUC lies as far from 0.5.", "",
              "| measurement | AUC, all seeds | p | kept seeds' values | stopped seeds' values |",
              "|---|---|---|---|---|"]
    whole_auc = {}
    for name in whole:
        values = table[name]
        whole_auc[name] = (auc(values, kept), shuffled_p(values, kept, permutations))
        lines.append(f"| {name} | {whole_auc[name][0]:.3f} | {whole_auc[name][1]:.2f} | "
                     f"{value_columns(values, kept, 4)} |")
    data = {"label": label, "screen_score": screen_score, "held_out_from": held_out_from,
            "chance_separation": chance, "permutations": permutations,
            "seeds": [{"seed": r["seed"], "run": r["run"], "screen": r["screen"], "kept": k,
                       "measurements": m}
                      for r, k, m in zip(records, kept, measurements, strict=True)],
            "auc": [{"measurement": n, "first": a, "second": b} for n, a, b in usable],
            "model_wide": [{"measurement": n, "auc": a, "p": p} for n, (a, p) in whole_auc.items()]}
    return "\n".join(lines) + "\n", data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    parser.add_argument("--label-step", type=int, default=4000)
    parser.add_argument("--label-length", type=int, default=256)
    parser.add_argument("--screen-score", type=float, default=0.04)
    parser.add_argument("--multipliers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--samples", type=int, default=32, help="validation samples measured per length")
    parser.add_argument("--held-out-from", type=int, default=13)
    parser.add_argument("--permutations", type=int, default=200)
    parser.add_argument("--top", type=int, default=15, help="measurements listed in the .md")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.samples < 1 or args.permutations < 1 or any(m < 1 for m in args.multipliers):
            raise ProbeError("--samples, --permutations and --multipliers must be at least 1")
        records = read_runs(args.run_dirs, args.label_step, args.label_length)
        measurements = []
        for record in records:
            print(f"seed {record['seed']} ({record['run']})", file=sys.stderr, flush=True)
            measurements.append(measure(record, args.multipliers, args.samples))
        label = f"validation % at {args.label_length} tokens, step {args.label_step}"
        text, data = report(records, measurements, args.held_out_from, args.permutations, label,
                            args.screen_score, args.top)
    except (ProbeError, RunError) as error:
        print(f"init_probe: error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/init_probe.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_text(args.out / f"{NAME}.md", f"    {command}\n\n{text}")
    write_json(args.out / f"{NAME}.json", {"command": command, **data})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
