"""Which MQMTAR queries a run gets wrong: an error analysis of its greedy answers, query by query.

MQMTAR (arXiv:2506.16640, section 3; asentmax.tasks.mqmtar) asks 4 queries `? k1 k2` about a context of
`k1 k2 : v1 v2 _` blocks; each answer is `? v1 v2`. For each test length (a multiplier of the run's training
length, as `asentmax eval` plans it, on the same seeded test sets) the samples are decoded greedily and each
query's answer is put in one class:

- correct: the marker and both value tokens right;
- other_value: the value pair of another key of the same context (the wrong pair retrieved), with whether
  that key shares its first or its second token with the queried key and the signed distance, in tokens and
  in pairs, from the right pair to the wrong one (> 0: the wrong pair sits later, nearer the queries);
- half: exactly one of the two value tokens right (and not other_value);
- other: anything else.

Each answer also records its query index (0-3), the tenth of the context its key sits in, whether its key is
queried more than once in the sample, whether another key of the context shares a token with it (same
position), whether its key's word is also another pair's value (MQMTARTask.query_collisions: the collision
that benchmarks/mqmtar_collisions.py finds behind the best runs' 1,024x cells), and whether an earlier answer
of the sample was wrong (greedy errors compounding). Writes
mqmtar_errors.json (every count, per length) and mqmtar_errors.md (class counts and error rates by each of
those) under --out.

    PYTHONPATH=src python benchmarks/mqmtar_errors.py RUN_DIR --multipliers 1 4 16 --samples 200 --out DIR

`--lookalikes R` draws the test sets with planted look-alikes instead (MQMTARTask's training option: in that
share of the samples one queried key has a look-alike, a key sharing one of its tokens or its word as another
pair's value), a probe of whether a model tells them apart at short lengths, where the paper's samples hold
almost none (at 1,024x 4 in 10 samples ask a key whose word is also a value:
results/paper/mqmtar/collisions.md); `--lookalike-kinds value` (or first, second) plants those kinds only.
`--tables fresh` draws every length's test set with new key and value tables, as `asentmax eval --tables
fresh` does (and the paper's code for every test set), with or without planted look-alikes.
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from pathlib import Path

import torch

from asentmax.cli import Parser, UsageError
from asentmax.eval import EvalConfig, examples_for_length, plan_evaluation
from asentmax.precision import autocast
from asentmax.runs import RunError, format_multiplier, write_json, write_text
from asentmax.tasks.base import BOS, EOS, SEP
from asentmax.tasks.mqmtar import COLON, MQMTARTask
from asentmax.tasks.scoring import shape_batches

CLASSES = ("correct", "other_value", "half", "other")
KEY_PARTS = 10  # the key's place in the context, by tenths
GROUPINGS = {  # per-answer field -> (the markdown's heading, how it names the field's values)
    "query_index": ("query index (0: asked first)", lambda value: f"query {value}"),
    "key_tenth": ("the tenth of the context the queried key sits in",
                  lambda value: f"{10 * value}-{10 * value + 10}%"),
    "repeated_key": ("the key queried more than once in the sample",
                     lambda value: "more than once" if value else "once"),
    "key_has_lookalike": ("another key of the context sharing a token with the queried key (same place)",
                          lambda value: "shares a token" if value else "none does"),
    "key_is_a_value": ("the queried key's word also written as another pair's value",
                       lambda value: "also a value" if value else "a key only"),
    "earlier_wrong": ("an earlier answer of the sample wrong",
                      lambda value: "an earlier one wrong" if value else "none earlier wrong"),
}


def context_pairs(task, example) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    """(start, key, value) of every `k1 k2 : v1 v2` block of the example's context, in context order."""
    context = example.source[:len(example.source) - 3 * task.n_queries]
    return [(start, (context[start], context[start + 1]), (context[start + 3], context[start + 4]))
            for start in range(len(context) - 4) if context[start + 2] == COLON]


def classify_answers(task, example, predicted_tokens) -> list[dict]:
    """One record per query of `example` for the decoded answer `predicted_tokens` (at least the target's
    tokens; what follows them, EOS, is ignored): its class (CLASSES), query_index, key_tenth,
    repeated_key, key_has_lookalike, key_is_a_value, earlier_wrong, marker_right, and for other_value the
    retrieved key's shares_first/shares_second flags, distance (tokens) and pair_offset (pairs) from the right
    pair."""
    pairs = context_pairs(task, example)
    order = {key: (i, start, value) for i, (start, key, value) in enumerate(pairs)}
    by_value = {value: (i, start, key) for i, (start, key, value) in enumerate(pairs)}
    context_length = len(example.source) - 3 * task.n_queries
    queried = [tuple(example.source[context_length + 3 * j + 1:context_length + 3 * j + 3])
               for j in range(task.n_queries)]
    lookalikes = task.query_collisions(example)  # per query: keys sharing its 1st / 2nd token, values = it
    records, wrong_so_far = [], False
    for j, key in enumerate(queried):
        index, start, value = order[key]
        marker, *answer = predicted_tokens[3 * j:3 * j + 3]
        answer = tuple(answer)
        record = {"query_index": j, "key_tenth": start * KEY_PARTS // context_length,
                  "repeated_key": queried.count(key) > 1,
                  "key_has_lookalike": lookalikes[j][0] + lookalikes[j][1] > 0,
                  "key_is_a_value": lookalikes[j][2] > 0,
                  "earlier_wrong": wrong_so_far, "marker_right": marker == example.target[3 * j]}
        if answer == value and record["marker_right"]:
            record["class"] = "correct"
        elif answer != value and answer in by_value:
            other_index, other_start, other_key = by_value[answer]
            record.update({"class": "other_value", "shares_first": other_key[0] == key[0],
                           "shares_second": other_key[1] == key[1], "distance": other_start - start,
                           "pair_offset": other_index - index})
        elif sum(got == want for got, want in zip(answer, value, strict=True)) == 1:
            record["class"] = "half"
        else:
            record["class"] = "other"
        wrong_so_far = wrong_so_far or record["class"] != "correct"
        records.append(record)
    return records


@torch.no_grad()
def greedy_answers(model, examples, *, device, autocast_dtype, batch_size: int,
                   max_batch_tokens: int) -> list[list[int]]:
    """The greedy continuation (target + EOS tokens long) of every prompt `<bos> source <sep>`, batched as
    asentmax.eval.greedy_accuracy batches them; in the order of `examples`."""
    answers: list[list[int] | None] = [None] * len(examples)
    for indices in shape_batches(examples, lambda e: (len(e.source) + 2, len(e.target)), batch_size,
                                 max_batch_tokens):
        prompts = torch.tensor([[BOS, *examples[i].source, SEP] for i in indices], dtype=torch.long,
                               device=device)
        with autocast(device, autocast_dtype):
            out = model.generate(prompts, len(examples[indices[0]].target) + 1, temperature=0.0)
        for i, row in zip(indices, out[:, prompts.shape[1]:].tolist(), strict=True):
            answers[i] = row
    return answers


def class_counts(records: list[dict]) -> dict:
    """{"n": answers, and each class: its count} of `records`."""
    counts = Counter(record["class"] for record in records)
    return {"n": len(records), **{name: counts[name] for name in CLASSES}}


def summarise(records: list[dict]) -> dict:
    """Every count of one length's answer records: by class, by each GROUPINGS field and class, and for the
    other_value answers the shared key tokens and the histograms of their distances."""
    retrieved = [record for record in records if record["class"] == "other_value"]
    shared = Counter("both" if r["shares_first"] and r["shares_second"] else "first" if r["shares_first"]
                     else "second" if r["shares_second"] else "none" for r in retrieved)
    return {"classes": class_counts(records),
            "marker_wrong": sum(not record["marker_right"] for record in records),
            "by": {field: [{"value": value, **class_counts([r for r in records if r[field] == value])}
                           for value in sorted({r[field] for r in records})] for field in GROUPINGS},
            "other_value": {"shared_key_token": {name: shared[name] for name in ("first", "second", "both",
                                                                                  "none")},
                            "distance": histogram(r["distance"] for r in retrieved),
                            "pair_offset": histogram(r["pair_offset"] for r in retrieved)}}


def histogram(values) -> dict[str, int]:
    """{value: count}, smallest value first, keyed by the value's text (as JSON keeps it)."""
    return {str(value): count for value, count in sorted(Counter(values).items())}


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}" if whole else "-"


def length_markdown(row: dict, id_length: int) -> str:
    """The markdown of one length: the class table, the error rate by each grouping, the wrong pairs."""
    counts = row["classes"]
    lines = [f"### length {row['length']} ({format_multiplier(row['length'] / id_length)}): "
             f"{row['samples']} samples, {counts['n']} answers", "",
             "| class | answers | % |", "|---|---|---|"]
    lines += [f"| {name} | {counts[name]} | {percent(counts[name], counts['n'])} |" for name in CLASSES]
    lines += ["", f"Answers with a wrong query marker: {row['marker_wrong']}; samples without EOS after the "
              f"answers: {row['eos_wrong']}."]
    for field, (heading, name) in GROUPINGS.items():
        lines += ["", f"Error rate by {heading}:", "",
                  "| answers | n | errors % | other_value % | half % | other % |", "|---" * 6 + "|"]
        for group in row["by"][field]:
            errors = group["n"] - group["correct"]
            lines.append(f"| {name(group['value'])} | {group['n']} | "
                         f"{percent(errors, group['n'])} | "
                         + " | ".join(percent(group[c], group["n"]) for c in CLASSES[1:]) + " |")
    retrieved = row["other_value"]
    n_retrieved = counts["other_value"]
    if n_retrieved:
        shared = retrieved["shared_key_token"]
        before = sum(n for d, n in retrieved["distance"].items() if int(d) < 0)
        offsets = ", ".join(f"{int(o):+d}: {n}" for o, n in retrieved["pair_offset"].items())
        lines += ["", f"Wrong pairs retrieved (other_value, {n_retrieved}): their key shares the first token "
                  f"with the queried key in {shared['first']}, the second in {shared['second']}, neither in "
                  f"{shared['none']}; the wrong pair sits before the right one in {before}, after it in "
                  f"{n_retrieved - before}. By offset in pairs (wrong - right): {offsets}."]
    return "\n".join(lines) + "\n"


def plan_analysis(run_dir: Path, config: EvalConfig, out: Path):
    """asentmax.eval's plan of evaluating `run_dir` (its run, checkpoint, task, device, autocast and
    lengths), refused with RunError / ValueError (one line) before any computing, also when the run is not an
    MQMTAR run."""
    plan = plan_evaluation(run_dir, config, out / "mqmtar_errors", fresh=True)
    if plan.task.name != "mqmtar":
        raise RunError(f"{run_dir} is a {plan.task.name!r} run, not an MQMTAR run")
    return plan


def analyse(plan, out: Path, command: str, lookalikes: float = 0.0, lookalike_kinds: tuple[str, ...] = ()
            ) -> dict:
    """Classify every answer of the plan's test sets (asentmax eval's, by its seed and its config's tables;
    with `lookalikes` > 0 drawn with that share of planted look-alikes, of `lookalike_kinds`, by default every
    kind) at each length; writes mqmtar_errors.json and .md under `out` and returns the result."""
    from asentmax.nn import Transformer
    from asentmax.tasks import get_task

    config = plan.config
    model = Transformer(plan.model_config)
    model.load_state_dict(plan.model_state)
    model.to(plan.device).eval()
    task = plan.task
    if lookalikes:
        task = get_task("mqmtar", layout=plan.task.layout, lookalikes=lookalikes,
                        lookalike_kinds=lookalike_kinds)
    rows = []
    for length in plan.lengths:
        length_task, examples = examples_for_length(task, length, config.samples, config.seed,
                                                    config.tables)
        answers = greedy_answers(model, examples, device=plan.device, autocast_dtype=plan.autocast_dtype,
                                 batch_size=config.batch_size, max_batch_tokens=config.max_batch_tokens)
        records = [record for example, answer in zip(examples, answers, strict=True)
                   for record in classify_answers(length_task, example, answer)]
        eos_wrong = sum(answer[len(example.target)] != EOS
                        for example, answer in zip(examples, answers, strict=True))
        rows.append({"length": length, "samples": len(examples), "eos_wrong": eos_wrong,
                     **summarise(records)})
        counts = rows[-1]["classes"]
        print(f"length {length}: " + ", ".join(f"{name} {counts[name]}" for name in CLASSES)
              + f" of {counts['n']} answers", file=sys.stderr, flush=True)
    result = {"command": command, "run_dir": str(plan.run_dir), "checkpoint": config.checkpoint,
              "checkpoint_step": plan.header["train_step"], "id_length": plan.header["id_length"],
              "seed": config.seed, "tables": config.tables, "lookalikes": lookalikes,
              "lookalike_kinds": list(task.lookalike_kinds) if lookalikes else [],
              "device": plan.header["device"], "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "mqmtar_errors.json", result)
    write_text(out / "mqmtar_errors.md", markdown(result))
    return result


def markdown(result: dict) -> str:
    """mqmtar_errors.md: the command and checkpoint, then each length's tables."""
    head = [f"## MQMTAR answer errors of {result['run_dir']} ({result['checkpoint']} checkpoint, step "
            f"{result['checkpoint_step']:,})", "", f"Command: `{result['command']}`", ""]
    if result.get("lookalikes"):
        kinds = ", ".join(result.get("lookalike_kinds") or ())
        head += [f"Test sets with planted look-alikes ({kinds}) in {100 * result['lookalikes']:g} % of the "
                 "samples (not `asentmax eval`'s).", ""]
    if result.get("tables") == "fresh":
        head += ["Every length's test set drawn with new key and value tables (`--tables fresh`).", ""]
    lengths = [length_markdown(row, result["id_length"]) for row in result["rows"]]
    return "\n".join(head) + "\n" + "\n".join(lengths)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="an MQMTAR run directory (config.json, checkpoint.pt)")
    parser.add_argument("--multipliers", type=float, nargs="+", default=[1.0],
                        help="test lengths as multiples of the run's training length")
    parser.add_argument("--samples", type=int, default=200, help="test samples per length")
    parser.add_argument("--checkpoint", choices=("last", "best"), default="last")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batch-size", type=int, default=64, help="most sequences decoded at once")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the test sets (asentmax eval's)")
    parser.add_argument("--tables", choices=("train", "fresh"), default="train",
                        help="the run's key and value tables, or new ones for every length (as "
                             "`asentmax eval --tables fresh`)")
    parser.add_argument("--lookalikes", type=float, default=0.0,
                        help="share of test samples with a planted look-alike of a queried key (default 0: "
                             "asentmax eval's test sets)")
    parser.add_argument("--lookalike-kinds", nargs="+", default=[],
                        help="with --lookalikes: the kinds planted, among first, second and value (default: "
                             "every kind)")
    parser.add_argument("--out", type=Path, required=True, help="mqmtar_errors.json and .md go here")
    command = "PYTHONPATH=src python benchmarks/mqmtar_errors.py " + shlex.join(argv)
    try:
        args = parser.parse_args(argv)
        config = EvalConfig(multipliers=tuple(args.multipliers), samples=args.samples,
                            checkpoint=args.checkpoint, device=args.device, batch_size=args.batch_size,
                            seed=args.seed, tables=args.tables, dispersion_samples=0)
        plan = plan_analysis(args.run_dir, config, args.out)
        if not 0 <= args.lookalikes <= 1:
            raise ValueError(f"--lookalikes must be a share in [0, 1], got {args.lookalikes}")
        if args.lookalike_kinds:
            if not args.lookalikes:
                raise ValueError("--lookalike-kinds: only with --lookalikes (a share of samples above 0)")
            MQMTARTask(lookalike_kinds=tuple(args.lookalike_kinds))  # ValueError for a kind it does not have
    except (UsageError, ValueError) as error:  # RunError is a ValueError
        print(f"mqmtar_errors: error: {error}", file=sys.stderr)
        return 2
    analyse(plan, args.out, command, args.lookalikes, tuple(args.lookalike_kinds))
    print(f"wrote {args.out / 'mqmtar_errors.json'} and {args.out / 'mqmtar_errors.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
