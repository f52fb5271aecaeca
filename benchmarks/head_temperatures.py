"""Per layer and head of a trained run: its inverse temperature and attention support against the test length,
and whether holding the temperature at its training range, raising it, or dropping heads changes its
generalisation.

ASEntmax and SSMax scale a head's logits by theta_hi = delta + beta_hi log(n_i + 1) ^ gamma_hi (SSMax:
[delta +] s_h log(n_i + 1)), n_i the keys query i sees (arXiv:2506.16640, section 2; asentmax.nn.temperature).
For each test length (the run's training length times --multipliers, on `asentmax eval`'s seeded test sets)
this writes:

- per layer and head, over a teacher-forced pass of --stats-samples samples (asentmax.nn.stats): theta's mean,
  minimum and maximum over every query and its mean at the answer queries (1 on a head without a
  temperature), and the support size (keys with p > 0) at the answer queries;
- greedy exact match of --samples samples as trained and, with --cap N, with every temperature computed from
  min(n_i, N) keys instead of n_i: a probe of whether a run's failure beyond its training length comes from
  theta's growth with n (N = the most keys a training query saw: Reverse's 64-symbol samples give 130);
- with --key-factor F, the same with every temperature computed from F * n_i keys, as if each query saw F
  times as many: a probe of whether attention sharper than the learned growth gives retrieves better far out;
- with --drop-heads L.H ..., the same with those heads' outputs set to 0 (layer L, head H, from 0; the
  attention output before its output projection): a probe of which heads a run needs at each length.
Each changed condition also counts the samples whose exact match differs from the run's as trained, either way
(asentmax.eval's exact_by_sample): equal percentages can hide answers that swapped.

    PYTHONPATH=src python benchmarks/head_temperatures.py RUN_DIR --multipliers 1 4 8 --samples 100 \\
        --cap 130 --drop-heads 0.4 0.5 --out DIR

RUN_DIR holds config.json and checkpoint.pt (`benchmarks/carry_checkpoint.py unpack` brings one back from the
device machine). Writes DIR/head_temperatures.json and .md; errors are one line, exit code 2.
"""

from __future__ import annotations

import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from asentmax.cli import Parser, UsageError
from asentmax.data import IGNORE_INDEX, collate
from asentmax.eval import EvalConfig, at_answers, greedy_accuracy, plan_evaluation
from asentmax.nn.temperature import TEMPERATURES
from asentmax.runs import format_multiplier, write_json, write_text
from asentmax.tasks import make_eval_set

NAME = "head_temperatures"


@contextmanager
def changed_key_counts(model, change):
    """Within the block, every temperature module of `model` computes theta from change(n_i) keys instead of
    n_i (change None: unchanged)."""
    if change is None:
        yield
        return
    modules = [m for m in model.modules() if isinstance(m, tuple(TEMPERATURES.values()))]

    def changed(forward):
        def changed_forward(x, n_keys, log_n=None):  # log_n, from the true counts, is recomputed
            return forward(x, change(n_keys))
        return changed_forward

    for module in modules:
        module.forward = changed(module.forward)
    try:
        yield
    finally:
        for module in modules:
            del module.forward  # the instance attribute: the class's forward again


def capped_key_counts(model, cap: int | None):
    """changed_key_counts with theta from min(n_i, cap) keys (cap None: unchanged)."""
    return changed_key_counts(model, None if cap is None else lambda n_keys: n_keys.clamp(max=cap))


def scaled_key_counts(model, factor: float | None):
    """changed_key_counts with theta from factor * n_i keys, as if each query saw that many (None:
    unchanged)."""
    return changed_key_counts(model, None if factor is None else lambda n_keys: n_keys * factor)


@contextmanager
def dropped_heads(model, heads: list[tuple[int, int]]):
    """Within the block, the outputs of `heads` ((layer, head) pairs) are 0 where each layer's attention
    enters its output projection (wo)."""
    width = model.config.head_dim
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def silence(heads_of_layer):
        def hook(module, args):
            kept = args[0].clone()
            for head in heads_of_layer:
                kept[..., head * width:(head + 1) * width] = 0
            return (kept, *args[1:])
        return hook

    handles = [model.blocks[layer].attn.wo.register_forward_pre_hook(silence(heads_of_layer))
               for layer, heads_of_layer in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def parse_heads(specs: list[str], n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """["0.4", "1.7"] -> [(0, 4), (1, 7)]; ValueError (one line) for a spec that is not LAYER.HEAD of the
    model."""
    heads = []
    for spec in specs:
        layer, _, head = spec.partition(".")
        if not (layer.isdigit() and head.isdigit() and int(layer) < n_layers and int(head) < n_heads):
            raise ValueError(f"--drop-heads: {spec!r} is not LAYER.HEAD of this model ({n_layers} layers of "
                             f"{n_heads} heads, counted from 0)")
        heads.append((int(layer), int(head)))
    return heads


@torch.no_grad()
def head_statistics(model, task, examples, device) -> list[dict]:
    """Per layer: {"theta_mean", "theta_min", "theta_max"} over every query and {"theta_at_answers",
    "support_at_answers"} at the answer queries (as `asentmax eval`'s dispersion), each a list over heads
    (theta 1 on a head without a temperature), from one teacher-forced pass over `examples`."""
    batch = collate(task, examples).to(device)
    _, stats = model(batch.input_ids, return_stats=True)
    answers = batch.labels != IGNORE_INDEX  # (B, T)
    theta_at_answers = at_answers(stats, answers, "theta").mean(2)  # (L, H)
    support_at_answers = at_answers(stats, answers, "support_size").mean(2)
    layers = []
    for index, layer in enumerate(stats):
        theta = layer.theta.float().transpose(1, 2)  # (B, T, H); NaN at padded queries
        every = theta[~theta.isnan().any(-1)]  # (queries, H)
        layers.append({"theta_mean": every.mean(0).tolist(), "theta_min": every.min(0).values.tolist(),
                       "theta_max": every.max(0).values.tolist(),
                       "theta_at_answers": theta_at_answers[index].tolist(),
                       "support_at_answers": support_at_answers[index].tolist()})
    return layers


def analyse(plan, cap: int | None, factor: float | None, drop: list[tuple[int, int]], stats_samples: int,
            command: str) -> dict:
    """Every length's head statistics and greedy exact match: as trained, with the key count capped (cap not
    None), with it times `factor` (not None) and with the heads of `drop` silenced (when there are any)."""
    from asentmax.nn import Transformer

    config = plan.config
    model = Transformer(plan.model_config)
    model.load_state_dict(plan.model_state)
    model.to(plan.device).eval()
    dropped = [f"{layer}.{head}" for layer, head in drop]
    rows = []
    for length in plan.lengths:
        examples = make_eval_set(plan.task, length, config.samples, config.seed)
        row = {"length": length, "samples": len(examples),
               "layers": head_statistics(model, plan.task, examples[:stats_samples], plan.device)}
        conditions = {"exact_match": (changed_key_counts(model, None), [])}
        if cap is not None:
            conditions["exact_match_capped"] = (capped_key_counts(model, cap), [])
        if factor is not None:
            conditions["exact_match_scaled"] = (scaled_key_counts(model, factor), [])
        if drop:
            conditions["exact_match_dropped"] = (changed_key_counts(model, None), drop)
        trained = None  # exact_by_sample as trained (the first condition)
        for label, (key_counts, silenced) in conditions.items():
            with key_counts, dropped_heads(model, silenced):
                scores = greedy_accuracy(model, plan.task, examples, device=plan.device,
                                         autocast_dtype=plan.autocast_dtype, batch_size=config.batch_size,
                                         max_batch_tokens=config.max_batch_tokens)
            row[label] = scores["exact_match"]
            if trained is None:
                trained = scores["exact_by_sample"]
            else:  # samples whose exact match differs from the run's as trained, either way
                row[f"{label}_changed"] = sum(a != b for a, b in zip(trained, scores["exact_by_sample"],
                                                                     strict=True))
        rows.append(row)
        others = "".join(f", {condition_name(label, cap, factor, dropped)} {100 * row[label]:.1f} % "
                         f"({row[label + '_changed']} changed)"
                         for label in conditions if label != "exact_match")
        print(f"length {length}: exact match {100 * row['exact_match']:.1f} %{others}", file=sys.stderr,
              flush=True)
    return {"command": command, "run_dir": str(plan.run_dir), "checkpoint": config.checkpoint,
            "checkpoint_step": plan.header["train_step"], "id_length": plan.header["id_length"],
            "seed": config.seed, "cap": cap, "key_factor": factor,
            "dropped_heads": dropped,
            "stats_samples": stats_samples, "device": plan.header["device"], "rows": rows}


def condition_name(label: str, cap: int | None, factor: float | None, dropped: list[str]) -> str:
    """How the report names the condition whose exact match a row keeps under `label`."""
    if label == "exact_match_capped":
        return f"theta from at most {cap} keys"
    if label == "exact_match_scaled":
        return f"theta from {factor:g} x n keys"
    return f"heads {' '.join(dropped)} dropped"


def _changed(count: int | None) -> str:
    """The suffix " (N changed)", N the samples whose exact match differs from the run's as trained; none
    for files written before the count was kept."""
    return "" if count is None else f" ({count} changed)"


def _cells(values: list[float], digits: int) -> str:
    return " ".join(f"{v:.{digits}f}" for v in values)


def markdown(result: dict) -> str:
    """The command, the exact match per length, then per length a table of layers x heads."""
    cap, factor, drop = result["cap"], result.get("key_factor"), result["dropped_heads"]
    columns = [label for label, shown in (("exact_match_capped", cap), ("exact_match_scaled", factor),
                                          ("exact_match_dropped", drop)) if shown]
    lines = [f"## Temperatures and support per head of {result['run_dir']} ({result['checkpoint']} "
             f"checkpoint, step {result['checkpoint_step']:,})", "", f"Command: `{result['command']}`", "",
             "| length | exact match % |" + "".join(f" {condition_name(label, cap, factor, drop)} |"
                                                  for label in columns),
             "|---|---|" + "---|" * len(columns)]
    for row in result["rows"]:
        name = f"{row['length']} ({format_multiplier(row['length'] / result['id_length'])})"
        lines.append(f"| {name} | {100 * row['exact_match']:.1f} |" + "".join(
            f" {100 * row[label]:.1f}{_changed(row.get(label + '_changed'))} |" for label in columns))
    for row in result["rows"]:
        lines += ["", f"Length {row['length']}, {result['stats_samples']} samples teacher-forced: per head "
                  "(space-separated), theta over every query (mean, min-max), at the answer queries, and the "
                  "support size at the answer queries.", "",
                  "| layer | theta mean | theta min | theta max | theta at answers | support at answers |",
                  "|---|---|---|---|---|---|"]
        for index, layer in enumerate(row["layers"]):
            lines.append(f"| {index} | {_cells(layer['theta_mean'], 2)} | {_cells(layer['theta_min'], 2)} | "
                         f"{_cells(layer['theta_max'], 2)} | {_cells(layer['theta_at_answers'], 2)} | "
                         f"{_cells(layer['support_at_answers'], 1)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path,
                        help="a synthetic-task run directory (config.json, checkpoint.pt)")
    parser.add_argument("--multipliers", type=float, nargs="+", default=[1.0],
                        help="test lengths as multiples of the run's training length")
    parser.add_argument("--samples", type=int, default=100, help="greedy-decoded test samples per length")
    parser.add_argument("--stats-samples", type=int, default=8,
                        help="of those, how many go through the teacher-forced pass of the head statistics")
    parser.add_argument("--cap", type=int, default=None,
                        help="also decode with every temperature computed from at most this many keys")
    parser.add_argument("--key-factor", type=float, default=None,
                        help="also decode with every temperature computed from this many times n_i keys")
    parser.add_argument("--drop-heads", nargs="+", default=[], metavar="LAYER.HEAD",
                        help="also decode with these heads' outputs set to 0 (layers and heads from 0)")
    parser.add_argument("--checkpoint", choices=("last", "best"), default="last")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--batch-size", type=int, default=64, help="most sequences decoded at once")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the test sets (asentmax eval's)")
    parser.add_argument("--out", type=Path, required=True, help=f"{NAME}.json and .md go here")
    command = f"PYTHONPATH=src python benchmarks/{NAME}.py " + shlex.join(argv)
    try:
        args = parser.parse_args(argv)
        if args.cap is not None and args.cap < 1:
            raise ValueError(f"--cap must be a number of keys >= 1, got {args.cap}")
        if args.key_factor is not None and not args.key_factor > 0:
            raise ValueError(f"--key-factor must be a positive number, got {args.key_factor}")
        if args.stats_samples < 1:
            raise ValueError(f"--stats-samples must be >= 1, got {args.stats_samples}")
        config = EvalConfig(multipliers=tuple(args.multipliers), samples=args.samples,
                            checkpoint=args.checkpoint, device=args.device, batch_size=args.batch_size,
                            seed=args.seed, dispersion_samples=0)
        plan = plan_evaluation(args.run_dir, config, args.out / NAME, fresh=True)
        drop = parse_heads(args.drop_heads, plan.model_config.n_layers, plan.model_config.n_heads)
    except (UsageError, ValueError) as error:  # RunError is a ValueError
        print(f"{NAME}: error: {error}", file=sys.stderr)
        return 2
    result = analyse(plan, args.cap, args.key_factor, drop, args.stats_samples, command)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{NAME}.json", result)
    write_text(args.out / f"{NAME}.md", markdown(result))
    print(f"wrote {args.out / NAME}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
