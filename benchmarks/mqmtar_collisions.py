"""Which MQMTAR retrieval rule an evaluated run behaves like: its exact match per length beside what three
imperfect rules would score on the same test samples.

MQMTAR (arXiv:2506.16640, section 3; asentmax.tasks.mqmtar) asks 4 queries `? k1 k2` about P pairs
`k1 k2 : v1 v2`. The key and value tables are drawn independently from the 65,536 two-token words, so in a
long context many keys share one token with the queried key (about P / 256 for each token) and the queried
word can also be some pair's value (15 % of key words are in the value table). A model that matches keys
only by one of their tokens, or matches the word wherever it occurs, takes a wrong pair for the right one
with a chance that only the sample decides. For each test sample of `asentmax eval` (regenerated exactly:
the run's task and layout, the evaluation's seed, sample count and tables; asentmax.eval.examples_for_length)
and each distinct queried key (greedy decoding answers a repeated key the same way), MQMTARTask.
query_collisions counts what looks like it, and each rule is right with chance 1 / (1 + that count):

- first token:  keys matched by their first token alone (the other keys sharing it);
- second token: keys matched by their second token alone;
- word:         the two-token word matched wherever it occurs, as a key or as a value (the values equal
                to it).

A sample is exact when all its queries are, so each rule predicts the mean over samples of the product over
its distinct keys. Everything else is assumed right: a rule's prediction is an upper bound of a model that
follows it. The same rules also give a training loss: on --train-samples samples of the training lengths
(uniform in [32, 64]), the cross-entropy per scored token (the 12 target tokens and <eos>) of a model that
follows a rule and is uniform over what it cannot tell apart, beside a fourth rule, value copy (the value of a
uniformly random pair of the context, log P nats per query): the loss plateaus of the training logs sit at
these levels. --train-lookalikes gives them also on the samples of `asentmax train --lookalikes r` (a share r
of them with a planted look-alike of a queried key), where the rules cost far more; `r:value` (or any of the
kinds first, second, value, joined by commas) on those of `--lookalikes r --lookalike-kinds value`. Writes
collisions.md (per evaluation: by how much each rule misses the observed intervals and which rules it behaves
like; per length: the observed exact match with its interval, the three predictions, the samples with a
key-as-value collision, where eval.json keeps exact_by_sample the exact samples among those and among the
others, and the rules whose prediction lies in the interval), collisions.json and collisions.png (the first
--panels evaluations, in the order given) under --out.

Pooled over evaluations: evaluations of one test set (the same test_set_digest at a length, so the same
samples: the runs' tables or the same fresh ones) that keep exact_by_sample and decode at least one sample
exactly there are pooled, and per sample the count of them that decode it exactly is compared between the
samples with a value collision and the others (the mean of each, and a two-sided permutation p of their
difference over POOL_PERMUTATIONS shuffles of which samples collide; test sets with at least
POOL_MIN_SAMPLES samples on each side). A second phase (a run initialised from a trained model of its
own attention, whose prior recipe eval.json keeps) is left out of the pool: it shares its base's weights,
so pooling both would count one model twice. A set of models that follow the word rule loses on the first;
one that tells a key from its word as a value, on neither more than the other.

    PYTHONPATH=src python benchmarks/mqmtar_collisions.py RUN_DIR ... --out results/paper/mqmtar
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

import numpy as np

from asentmax.eval import examples_for_length
from asentmax.runs import RunError, load_evaluation, write_json, write_text
from asentmax.tasks.eval_sets import eval_set_digest
from asentmax.tasks.mqmtar import COLON, MQMTARTask
from asentmax.tasks.workload import build_task

RULES = ("first token", "second token", "word")
LOSS_RULES = ("value copy",) + RULES
EVAL_FILES = ("eval.json", "eval_fresh.json")
POOL_PERMUTATIONS = 20_000
POOL_MIN_SAMPLES = 5


def sample_chances(task, example) -> dict[str, float]:
    """{rule: the chance that a model following it answers every query of `example` right} (module docstring),
    and "value_collision": whether a queried word is also some pair's value."""
    source = example.source
    context_length = len(source) - 3 * task.n_queries
    by_key = {tuple(source[context_length + 3 * j + 1:context_length + 3 * j + 3]): counts
              for j, counts in enumerate(task.query_collisions(example))}
    chances = dict.fromkeys(RULES, 1.0)
    for first, second, as_value in by_key.values():
        chances["first token"] /= 1 + first
        chances["second token"] /= 1 + second
        chances["word"] /= 1 + as_value
    chances["value_collision"] = any(as_value for _, _, as_value in by_key.values())
    return chances


def rule_losses(task, samples: int, seed: int, lengths=(32, 64)) -> dict[str, float]:
    """{rule: cross-entropy in nats per scored token} of LOSS_RULES on `samples` samples of lengths uniform in
    `lengths` (the module docstring): per query log P for value copy, log(1 + look-alikes) for the others;
    3 Q + 1 scored tokens a sample."""
    import numpy as np

    rng = np.random.default_rng(seed)
    total = dict.fromkeys(LOSS_RULES, 0.0)
    for _ in range(samples):
        example = task.sample(int(rng.integers(lengths[0], lengths[1] + 1)), rng)
        collisions = task.query_collisions(example)
        pairs = sum(1 for token in example.source if token == COLON)  # one colon a pair; none in queries
        for first, second, as_value in collisions:
            total["value copy"] += math.log(pairs)
            total["first token"] += math.log1p(first)
            total["second token"] += math.log1p(second)
            total["word"] += math.log1p(as_value)
    scored = samples * (3 * task.n_queries + 1)
    return {rule: value / scored for rule, value in total.items()}


def evaluation_rows(evaluation: dict) -> list[dict]:
    """Per length of an MQMTAR evaluation (eval.json's dict): length, multiplier, samples, observed exact
    match and interval (%), each rule's prediction (%) and the samples with a key-as-value collision, computed
    on the evaluation's own test samples; where the row keeps exact_by_sample (eval.json since commit
    ff2ef50), also the samples decoded exactly among those with a collision and among the
    others ("exact_with_collision", "exact_without_collision"): a word matcher loses the first far more
    often, a model that errs elsewhere both alike; those rows also keep the per-sample lists
    ("exact_by_sample", "collided_by_sample"), the test-set digest and "second_phase" (second_phase's), for
    pooled_rows. A row whose
    test_set_digest differs from the regenerated samples' is refused (RunError): the sampling changed
    since."""
    workload, config = evaluation["workload"], evaluation["eval_config"]
    if workload.get("task") != "mqmtar":
        raise RunError(f"{evaluation['run_dir']}: a {workload.get('task')!r} evaluation, not an MQMTAR one")
    task = build_task("mqmtar", workload.get("layout", "random"))
    tables = config.get("tables", "train")
    continues = second_phase(evaluation)
    rows = []
    for row in evaluation["rows"]:
        _, examples = examples_for_length(task, row["length"], row["n"], config["seed"], tables)
        if "test_set_digest" in row and row["test_set_digest"] != eval_set_digest(examples):
            raise RunError(f"{evaluation['run_dir']}: length {row['length']}: the regenerated test samples "
                           "are not the evaluated ones (test_set_digest differs): the task's sampling "
                           "changed since")
        chances = [sample_chances(task, example) for example in examples]
        collided = [c["value_collision"] for c in chances]
        entry = {"length": row["length"], "multiplier": row["length"] / evaluation["id_length"],
                 "n": row["n"], "observed": 100 * row["exact_match"], "ci_low": 100 * row["ci_low"],
                 "ci_high": 100 * row["ci_high"], "tables": tables,
                 **{rule: 100 * sum(c[rule] for c in chances) / len(chances) for rule in RULES},
                 "value_collisions": sum(collided)}
        exact = row.get("exact_by_sample")
        if exact is not None:
            if len(exact) != len(examples):
                raise RunError(f"{evaluation['run_dir']}: length {row['length']} has {len(exact)} entries in "
                               f"exact_by_sample for {len(examples)} test samples")
            entry["exact_with_collision"] = sum(e for e, c in zip(exact, collided, strict=True) if c)
            entry["exact_without_collision"] = sum(e for e, c in zip(exact, collided, strict=True) if not c)
            entry.update(exact_by_sample=[int(e) for e in exact],
                         collided_by_sample=[int(c) for c in collided],
                         test_set_digest=row.get("test_set_digest") or eval_set_digest(examples),
                         second_phase=continues)
        rows.append(entry)
    return rows


def second_phase(evaluation: dict) -> bool:
    """True for the evaluation of a run initialised from a trained model of its own attention (eval.json's
    prior_recipe: a second phase continuing an ASEntmax run), not from a softmax start or from scratch."""
    prior = (evaluation.get("prior_recipe") or {}).get("model_config", {}).get("attention")
    return prior is not None and prior == evaluation.get("model_config", {}).get("attention")


def pooled_rows(results: list[tuple[str, list[dict]]], permutations: int = POOL_PERMUTATIONS,
                min_samples: int = POOL_MIN_SAMPLES) -> list[dict]:
    """Per test set (digest) that two or more evaluations of `results` decode with some sample exact and keep
    exact_by_sample for (second phases left out), with at least `min_samples` samples with a value
    collision and as many without: the evaluations pooled, the mean count of them exact per sample with
    and without a collision, and the two-sided permutation p of that difference (numpy's default_rng(0)
    shuffling which samples collide)."""
    groups: dict[str, list[tuple[str, dict]]] = {}
    for label, rows in results:
        for row in rows:
            if "exact_by_sample" in row and sum(row["exact_by_sample"]) and not row["second_phase"]:
                groups.setdefault(row["test_set_digest"], []).append((label, row))
    pooled = []
    for members in groups.values():
        first = members[0][1]
        collided = np.asarray(first["collided_by_sample"], dtype=bool)
        if len(members) < 2 or min(collided.sum(), (~collided).sum()) < min_samples:
            continue
        counts = np.sum([row["exact_by_sample"] for _, row in members], axis=0)
        observed = counts[~collided].mean() - counts[collided].mean()
        rng = np.random.default_rng(0)
        shuffled = np.array([rng.permutation(collided) for _ in range(permutations)])
        differences = ((~shuffled) @ counts) / (~shuffled).sum(1) - (shuffled @ counts) / shuffled.sum(1)
        pooled.append({"length": first["length"], "multiplier": first["multiplier"],
                       "tables": first["tables"], "n": first["n"],
                       "evaluations": [label for label, _ in members],
                       "value_collisions": int(collided.sum()),
                       "mean_exact_with_collision": float(counts[collided].mean()),
                       "mean_exact_without_collision": float(counts[~collided].mean()),
                       "p": float(np.mean(np.abs(differences) >= abs(observed) - 1e-12))})
    return sorted(pooled, key=lambda row: (row["tables"], row["length"]))


SLACK = 1.0  # points an interval is widened by: a cell of 100 samples moves in steps of 1 point


def fitting_rules(row: dict, slack: float = SLACK) -> list[str]:
    """The rules whose prediction lies in the row's interval (widened by `slack` points)."""
    return [rule for rule in RULES if miss(row, rule) <= slack]


def miss(row: dict, rule: str) -> float:
    """How many points the rule's prediction lies outside the row's interval (0 inside)."""
    return max(0.0, row["ci_low"] - row[rule], row[rule] - row["ci_high"])


def verdict(rows: list[dict], slack: float = SLACK) -> str:
    """The rules within every row's interval (each widened by `slack`) that also tell the rows apart from a
    perfect model (predict below 99 % at some length), or "none of the three"."""
    rules = [rule for rule in RULES if all(miss(row, rule) <= slack for row in rows)
             and any(row[rule] < 99.0 for row in rows)]
    return ", ".join(rules) if rules else "none of the three"


def run_rows(run_dir: Path, files=EVAL_FILES) -> list[tuple[str, list[dict]]]:
    """[(label, evaluation_rows)] of each of `files` the run directory holds (eval.json: the label is the
    run's name; another file adds its stem, e.g. "run (eval_fresh)"). RunError when it holds none."""
    found = []
    for name in files:
        path = run_dir / name
        if path.is_file():
            evaluation = load_evaluation(path)
            evaluation["run_dir"] = str(run_dir)
            label = run_dir.name if name == "eval.json" else f"{run_dir.name} ({path.stem})"
            found.append((label, evaluation_rows(evaluation)))
    if not found:
        raise RunError(f"{run_dir}: none of {', '.join(files)}")
    return found


def multiplier_label(value: float) -> str:
    return f"{value:g}x"


def markdown(results: list[tuple[str, list[dict]]], command: str, losses: dict | None = None,
             pooled: list[dict] | None = None) -> str:
    lines = [f"Command: `{command}`", "",
             "Exact match % of each evaluation beside what three retrieval rules would score on the same "
             "test samples (benchmarks/mqmtar_collisions.py's docstring): first / second token = keys "
             "matched by one of their two tokens; word = the key's word matched wherever it occurs, also "
             "as a value. A rule's prediction is what a model that follows it and errs nowhere else would "
             "score.", "",
             "## Summary", "",
             "Points by which each rule's prediction misses the observed 95 % interval, the largest over the "
             "evaluation's lengths (0: inside at every length); behaves like: the rules inside every "
             f"interval (within {SLACK:g} point) that predict below 99 % somewhere.", "",
             "| evaluation | first token | second token | word | behaves like |", "|---" * 5 + "|"]
    for label, rows in results:
        worst = {rule: max(miss(row, rule) for row in rows) for rule in RULES}
        lines.append(f"| {label} | " + " | ".join(f"{worst[rule]:.1f}" for rule in RULES)
                     + f" | {verdict(rows)} |")
    if pooled:
        lines += ["", "## Pooled over evaluations", "",
                  "Per test set that several evaluations decode with some sample exact (the same samples: "
                  "one test-set digest): how many of them decode a sample exactly, on average over the "
                  "samples with a value collision and over the others, and the two-sided permutation p of "
                  f"the difference ({POOL_PERMUTATIONS:,} shuffles of which samples collide). Second "
                  "phases (runs initialised from a trained model of their own attention) are left out: "
                  "they share their base's weights. The p is about the samples, not the runs.",
                  "", "| length | tables | evaluations | value collisions | mean exact with / without | p |",
                  "|---" * 6 + "|"]
        lines += [f"| {row['length']} ({multiplier_label(row['multiplier'])}) | {row['tables']} | "
                  f"{len(row['evaluations'])}: {', '.join(row['evaluations'])} | "
                  f"{row['value_collisions']} of {row['n']} | {row['mean_exact_with_collision']:.2f} / "
                  f"{row['mean_exact_without_collision']:.2f} | {row['p']:.4f} |" for row in pooled]
    if losses:
        lines += ["", "## Training loss of each rule", "",
                  f"Cross-entropy per scored token (nats) on {losses['samples']:,} samples of the training "
                  "lengths (uniform in [32, 64]) of a model that follows the rule and is uniform over what "
                  "it cannot tell apart; value copy: the value of a uniformly random pair of the context. "
                  "Look-alikes: the share of training samples given a planted look-alike (`asentmax train "
                  "--lookalikes`, of the kinds named, by default every kind; 0 = the paper's samples). A "
                  "run's training loss below a rule's is a run that tells apart more than that rule does.",
                  "",
                  "| look-alikes | " + " | ".join(LOSS_RULES) + " |", "|---" * (len(LOSS_RULES) + 1) + "|"]
        lines += ["| " + " | ".join([_share_label(row)] + [f"{row[rule]:.2g}" for rule in LOSS_RULES])
                  + " |" for row in losses["rows"]]
    lines += ["", "## Per length", "",
              "Fits: the rules whose prediction lies in the observed interval at that length. Value "
              "collisions: test samples in which a queried key's word is also some pair's value. Exact "
              "with / without: the samples decoded exactly among those with a value collision and among the "
              "others (-: the evaluation did not keep which samples were exact: eval.json before "
              "commit ff2ef50); a word matcher loses about half of the first, a model that errs "
              "elsewhere both at one rate.", ""]
    for label, rows in results:
        lines += [f"### {label}", "",
                  "| length | observed % (95 % CI) | first token % | second token % | word % "
                  "| value collisions | exact with / without | fits |", "|---" * 8 + "|"]
        for row in rows:
            fits = ", ".join(fitting_rules(row)) or "none"
            split = "-"
            if "exact_with_collision" in row:
                split = (f"{row['exact_with_collision']} of {row['value_collisions']} / "
                         f"{row['exact_without_collision']} of {row['n'] - row['value_collisions']}")
            lines.append(f"| {row['length']} ({multiplier_label(row['multiplier'])}) | {row['observed']:.1f} "
                         f"({row['ci_low']:.1f}-{row['ci_high']:.1f}) | {row['first token']:.1f} | "
                         f"{row['second token']:.1f} | {row['word']:.1f} | {row['value_collisions']} of "
                         f"{row['n']} | {split} | {fits} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: list[tuple[str, list[dict]]], path: Path) -> None:
    """One panel per evaluation of `results`: observed exact match (with its interval) and the three rules'
    predictions against the length multiplier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(3, len(results))
    rows_of_panels = math.ceil(len(results) / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(4.6 * columns, 3.4 * rows_of_panels),
                             squeeze=False, sharey=True)
    styles = {"first token": ("tab:orange", "--"), "second token": ("tab:green", ":"),
              "word": ("tab:red", "-.")}
    for ax, (label, rows) in zip(axes.flat, results, strict=False):
        x = [row["multiplier"] for row in rows]
        observed = [row["observed"] for row in rows]
        errors = [[max(0.0, o - row["ci_low"]) for o, row in zip(observed, rows, strict=True)],
                  [max(0.0, row["ci_high"] - o) for o, row in zip(observed, rows, strict=True)]]
        ax.errorbar(x, observed, yerr=errors, color="black", marker="o", capsize=3, label="observed")
        for rule, (color, style) in styles.items():
            ax.plot(x, [row[rule] for row in rows], color=color, linestyle=style, label=rule)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [multiplier_label(m) for m in x], fontsize=7)
        ax.set_title(label, fontsize=8)
        ax.set_ylim(-3, 103)
    for ax in axes.flat[len(results):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("exact match %")
    axes.flat[0].legend(fontsize=7, loc="lower left")
    fig.suptitle("MQMTAR: observed exact match vs three retrieval rules on the same test samples",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _planting(text: str) -> tuple[float, tuple[str, ...]]:
    """--train-lookalikes' SHARE[:KIND,KIND...] -> (share, kinds); argparse's error for a bad one."""
    share_text, _, kinds_text = text.partition(":")
    try:
        share = float(share_text)
    except ValueError:
        share = math.nan
    kinds = tuple(kinds_text.split(",")) if kinds_text else ()
    if not 0 <= share <= 1:
        raise argparse.ArgumentTypeError(f"a share in [0, 1] (then :KINDS), got {text!r}")
    if kinds and not share:
        raise argparse.ArgumentTypeError(f"kinds only with a share above 0, got {text!r}")
    try:
        _planting_task(share, kinds)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return share, kinds


def _planting_task(share: float, kinds: tuple[str, ...]) -> MQMTARTask:
    return MQMTARTask(lookalikes=share, lookalike_kinds=kinds)


def _share_label(row: dict) -> str:
    """0.1, or 0.1 (value) for a row of chosen kinds."""
    kinds = row.get("lookalike_kinds")
    return f"{row['lookalikes']:g}" + (f" ({', '.join(kinds)})" if kinds else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="evaluated MQMTAR run directories")
    parser.add_argument("--files", nargs="+", default=list(EVAL_FILES),
                        help="the evaluation files to read in each run directory (default: eval.json and "
                             "eval_fresh.json, where present)")
    parser.add_argument("--train-samples", type=int, default=20000,
                        help="training samples for the rules' training losses (0: none; default 20000)")
    parser.add_argument("--train-lookalikes", type=_planting, nargs="+", default=[(0.0, ()), (0.5, ())],
                        metavar="SHARE[:KINDS]",
                        help="the training losses with each of these shares of planted look-alikes "
                             "(asentmax train --lookalikes), of the kinds after a colon (--lookalike-kinds, "
                             "comma-separated; default every kind), e.g. 0.1:value (default: 0 0.5)")
    parser.add_argument("--panels", type=int, default=6,
                        help="collisions.png shows the first this many evaluations (default 6)")
    parser.add_argument("--out", type=Path, required=True, help="collisions.md, .json and .png go here")
    args = parser.parse_args(argv)
    command = "PYTHONPATH=src python benchmarks/mqmtar_collisions.py " + shlex.join(argv)
    try:
        results = [found for run_dir in args.run_dirs for found in run_rows(run_dir, args.files)]
    except RunError as error:
        print(f"mqmtar_collisions: error: {error}", file=sys.stderr)
        return 2
    losses = None
    if args.train_samples > 0:
        losses = {"samples": args.train_samples, "rows": [
            {"lookalikes": share, "lookalike_kinds": list(kinds),
             **rule_losses(_planting_task(share, kinds), args.train_samples, seed=0)}
            for share, kinds in args.train_lookalikes]}
    pooled = pooled_rows(results)
    args.out.mkdir(parents=True, exist_ok=True)
    per_sample = ("exact_by_sample", "collided_by_sample")  # eval.json keeps the first; the second is redrawn
    write_json(args.out / "collisions.json", {"command": command, "training_losses": losses, "evaluations": [
        {"label": label, "rows": [{key: value for key, value in row.items() if key not in per_sample}
                                  for row in rows]} for label, rows in results], "pooled": pooled})
    write_text(args.out / "collisions.md", markdown(results, command, losses, pooled))
    plot(results[:max(1, args.panels)], args.out / "collisions.png")
    print(f"wrote {args.out / 'collisions.md'}, collisions.json and collisions.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
