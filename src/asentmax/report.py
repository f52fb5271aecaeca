"""Side-by-side report of evaluated runs (the library behind `asentmax compare` and the demo, below the
drivers): a markdown table with the paper's numbers (arXiv:2506.16640,
its synthetic-task results), an accuracy-vs-length plot (log x axis) and an attention-dispersion plot
(normalised entropy and support size vs length: the paper's attention-dispersion argument; and, for
evaluations that recorded it, the mean inverse temperature theta of the heads ASEntmax or SSMax scale, which
shows a temperature that falls as the length grows) from the `dispersion` entries `asentmax eval` stores per
length.

A third plot, training.png, shows how each run got there: its training loss and its validation exact match
at every validation length against the samples it had seen (log.csv and val.csv of the run directory;
samples = step x batch size), where a loss plateau and a still-rising validation curve can be seen, and, for
runs whose log.csv has the column, the mean pre-clipping gradient norm of each log window beside Adam's floor
for it, eps x sqrt(parameters) (`adam_floor`): below that line the gradient's RMS per parameter is under
AdamW's eps, so its steps shrink with the gradient instead of staying about the learning rate's size.

Runs of one recipe (seeds, or repeats of a seed) are also summarised together (repeat_table: the median and
the range per length), since length generalisation can differ far more between seeds than a test interval
suggests, and recipes that share seeds side by side by seed (seed_table), which tells a seed that fails under
every recipe from a recipe that fails. Evaluations that tested the same samples are compared sample by
sample (asentmax.paired: the "Paired" table, McNemar's exact test).

Writes compare.md, compare.json, accuracy.png, dispersion.png (when dispersion was measured), training.png
(when a run directory holds its logs) and repeats.png (when runs share a recipe: repeat_table's groups as a
median curve in a band from the lowest run to the highest), after every eval.json has been read and checked
(asentmax.runs.load_evaluation: RunError naming a bad file).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, fields
from functools import partial
from pathlib import Path
from statistics import median

from asentmax.nn.config import ModelConfig
from asentmax.nn.normalisers import NORMALISERS
from asentmax.nn.positions import scaled_head_count
from asentmax.nn.presets import PAPER_CODE_BLOCKS
from asentmax.paired import paired_rows, paired_table
from asentmax.runs import (
    CONFIG_NAME,
    RunError,
    format_multiplier,
    load_evaluation,
    load_stalled,
    read_json,
    run_name,
    samples_trained,
    saved_evaluation,
    saved_layout,
    stall_reason,
    stalled_unevaluated,
    training_grad_norm,
    training_loss,
    validation_exact_match,
    write_json,
)
from asentmax.tasks.registry import eval_multipliers, get_task
from asentmax.tasks.workload import TaskWorkload
from asentmax.trainer import ADAM_EPS, TrainConfig

# arXiv:2506.16640, exact match % per length multiplier with NAPE positions (MQMTAR, Reverse from the
# paper's tables; Copy and Sort read second-hand from an independent reproduction's notes); the multipliers
# are the tasks' (Task.eval_multipliers, the lengths `asentmax eval` tests by default). PAPER_SAMPLES: the
# training samples of the paper code's runs (batch 128 x steps; results/paper/README.md) and its 1,000 test
# samples per length.
PAPER_SAMPLES = {"mqmtar": 50_000_000, "sort": 40_000_000, "reverse": 30_000_000, "copy": 20_000_000}
PAPER_TEST_SAMPLES = 1000
PAPER_RESULTS = {
    "mqmtar": {
        "multipliers": eval_multipliers("mqmtar"),
        "softmax": (100.0, 100.0, 100.0, 99.5, 97.8, 80.2, 3.0),
        "ssmax": (99.9, 100.0, 99.9, 99.6, 98.3, 90.6, 26.7),
        "entmax": (100.0, 100.0, 100.0, 99.2, 92.7, 66.8, 9.3),
        "asentmax": (100.0, 100.0, 100.0, 99.7, 99.6, 99.0, 95.3),
    },
    "reverse": {
        "multipliers": eval_multipliers("reverse"),
        "softmax": (100.0, 36.0, 0.0, 0.0, 0.0),
        "entmax": (100.0, 100.0, 93.5, 28.5, 2.5),
        "asentmax": (100.0, 100.0, 99.8, 96.4, 56.7),
    },
    "copy": {
        "multipliers": eval_multipliers("copy"),
        "softmax": (100.0, 100.0, 99.9, 99.9, 99.4, 96.1, 85.5),
        "asentmax": (100.0, 100.0, 99.9, 99.7, 99.4, 96.3, 86.6),
    },
    "sort": {
        "multipliers": eval_multipliers("sort"),
        "softmax": (100.0, 0.0, 0.0, 0.0),
        "entmax": (100.0, 99.3, 57.8, 0.0),
        "asentmax": (100.0, 100.0, 79.7, 0.0),
    },
}
METHOD_NAMES = {n.name: n.label for n in NORMALISERS}


def block_notes(model_config: dict) -> list[str]:
    """The block options of a saved model config that are not ModelConfig's defaults, briefly: ["paper-code
    blocks"] when they are nn.presets.PAPER_CODE_BLOCKS (its ASEntmax init counted for ASEntmax only; the
    frozen zero embedding, task-specific, not named), followed by "asentmax_init VALUE" when only that init
    differs from the bundle's; else one "field value" each; [] for default blocks and for a config saved
    before the options existed."""
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    names = [name for name in (*PAPER_CODE_BLOCKS, "zero_embedding_id")
             if name != "asentmax_init" or model_config.get("attention") == "asentmax"]
    values = {name: model_config.get(name, defaults[name]) for name in names}
    off_bundle = [name for name in names
                  if name in PAPER_CODE_BLOCKS and values[name] != PAPER_CODE_BLOCKS[name]]
    if not off_bundle:
        return ["paper-code blocks"]
    if off_bundle == ["asentmax_init"]:
        return ["paper-code blocks", f"asentmax_init {values['asentmax_init']}"]
    return [f"{name} {values[name]}" for name in names if values[name] != defaults[name]]


def method_label(result: dict) -> str:
    """Paper name of the attention, with the position scheme when it is not the paper's NAPE, the block
    options when they are not the defaults (block_notes), the sample layout when it is not the default
    (MQMTAR's "stretches": results/paper/README.md) and the share of training samples with a planted
    look-alike when there is one (MQMTAR's `lookalikes`: its training data is not the paper's), with their
    kinds when not every kind was planted, and the parameters a run started from another's weights drew afresh
    instead (--init-fresh: prior_recipe's fresh_parameters, named without their block prefix)."""
    config = result["model_config"]
    name = METHOD_NAMES.get(config["attention"], config["attention"])
    notes = [config["position"]] if config.get("position", "nape") != "nape" else []
    notes += block_notes(config)
    workload = result.get("workload") or {}
    layout = saved_layout(workload)
    if layout != "random":
        notes.append(f"{layout} layout")
    if workload.get("lookalikes"):
        kinds = "/".join(workload.get("lookalike_kinds") or ())  # empty: every kind
        notes.append(f"{kinds + ' ' if kinds else ''}look-alikes {workload['lookalikes']:g}")
    prior = result.get("prior_recipe")
    fresh = prior.get("fresh_parameters") if isinstance(prior, dict) else None
    if fresh:
        notes.append("fresh " + "/".join(sorted({re.sub(r"^blocks\.\d+\.", "", name) for name in fresh})))
    return f"{name} ({', '.join(notes)})" if notes else name


def _multiplier(row: dict, result: dict) -> float:
    return row["length"] / result["id_length"]


def _column_name(m: float) -> str:
    return "ID" if m == 1 else format_multiplier(m)


def samples_seen(result: dict) -> int | None:
    """Training samples behind an evaluated checkpoint (runs.samples_trained of its eval.json)."""
    return samples_trained(result.get("train_step"), result.get("train_config"),
                           result.get("prior_samples", 0))


def _samples(n: int | None) -> str:
    """8,192,000 -> 8.2M; None -> -."""
    if n is None:
        return "-"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}K" if n >= 1e3 else str(n)


def _test_counts(result: dict) -> str:
    """The test samples per length: one number, or the range where lengths differ."""
    counts = sorted({row["n"] for row in result["rows"]})
    return "-" if not counts else f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}-{counts[-1]:,}"


def comparison_table(results: list[dict]) -> str:
    """Markdown table shaped like the paper's results tables: our runs' exact match % and the paper's."""
    multipliers = sorted({_multiplier(row, r) for r in results for row in r["rows"]})
    header = ["task", "method", "source", "samples", "test n", *(_column_name(m) for m in multipliers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    paper_rows_done = set()
    for result in results:
        by_m = {_multiplier(row, result): row for row in result["rows"]}
        cells = [f"{100 * by_m[m]['exact_match']:.1f}" if m in by_m else "-" for m in multipliers]
        lines.append(f"| {result['task']} | {method_label(result)} | ours ({run_name(result)}) | "
                     f"{_samples(samples_seen(result))} | {_test_counts(result)} | "
                     + " | ".join(cells) + " |")
        paper = PAPER_RESULTS.get(result["task"], {})
        key = (result["task"], result["model_config"]["attention"])
        if key[1] in paper and key not in paper_rows_done:
            paper_rows_done.add(key)
            values = dict(zip(paper["multipliers"], paper[key[1]], strict=True))
            cells = [f"{values[m]:.1f}" if m in values else "-" for m in multipliers]
            lines.append(f"| {result['task']} | {METHOD_NAMES[key[1]]} | paper | "
                         f"{_samples(PAPER_SAMPLES.get(result['task']))} | {PAPER_TEST_SAMPLES:,} | "
                         + " | ".join(cells) + " |")
    ids = sorted({r["id_length"] for r in results})
    tagged = sorted({r["task"] for r in results if get_task(r["task"]).tagging})
    scored = (f" ({', '.join(tagged)}: of the argmax label at every source token, one forward pass)"
              if tagged else "")
    note = (f"\nExact match % of greedy decoding{scored}; ID = length {', '.join(map(str, ids))} "
            "for our runs, 64 in the paper (arXiv:2506.16640, NAPE; '-' = not measured); samples: "
            "training samples seen (step x batch size of the tested checkpoint, plus those of its "
            "--init-from weights); test n: test samples per length.\n")
    for result in results:
        if result.get("pending_lengths"):
            note += (f"{run_name(result)}: evaluation unfinished, lengths "
                     f"{', '.join(map(str, result['pending_lengths']))} still to do.\n")
    return "\n".join(lines) + "\n" + note


# Config fields that do not make a recipe: the seeds; the stall checks (one that does not fire changes nothing
# a run computes, so a screened seed that passed is a run of the unscreened recipe); and what a run observes
# and keeps of itself (logs, checkpoints, its validations: their samples come from a generator of their own),
# except that keep_best_at picks the weights an evaluation of best.pt tests
NOT_RECIPE = {"train_config": ("seed", "data_seed", "stall_step", "stall_loss", "stall_val_step",
                               "stall_val_score", "val_every", "log_every", "checkpoint_every"),
              "workload": ("val_multipliers", "val_samples", "keep_best_at", "stall_val_at")}


def _recipe(record: dict) -> str | None:
    """What a run trains, as a JSON key (its task, model, workload and training config but for NOT_RECIPE,
    and what its --init-from weights were trained on: the recipe of the run that trained them where the
    record keeps it as prior_recipe, else their sample count, and the parameters it drew afresh instead,
    prior_recipe's "fresh_parameters" from --init-fresh); None for a record without a seed or one this
    version cannot read. A field that a run's files lack (written before it existed) counts at the value it
    had then (the configs' from_dict); a record without fresh parameters keeps the key it had before them."""
    prior, fresh = record.get("prior_recipe"), None
    if isinstance(prior, dict) and "fresh_parameters" in prior:
        fresh = prior["fresh_parameters"]
        prior = {key: value for key, value in prior.items() if key != "fresh_parameters"} or None
    if prior is None:
        start = record.get("prior_samples") or 0
    elif isinstance(prior, dict):  # a start that --steps-after-escape ended: its seed's length, its rule
        start = _recipe({"task": (prior.get("workload") or {}).get("task", record.get("task")), **prior})
        if start is None:
            return None
    else:
        return None
    train_config = record.get("train_config")
    if not isinstance(train_config, dict) or "seed" not in train_config:
        return None
    try:  # each config as its class reads a saved one (fields added since at the values they had then)
        recipe = {name: value for name, value in asdict(TrainConfig.from_dict(train_config)).items()
                  if name not in NOT_RECIPE["train_config"]}
        model = asdict(ModelConfig.from_dict(record.get("model_config")))
        workload = asdict(TaskWorkload.from_dict(record.get("workload") or {}))
        workload = {name: value for name, value in workload.items() if name not in NOT_RECIPE["workload"]}
    except (TypeError, ValueError):  # a record this version cannot read: no recipe to compare
        return None
    return json.dumps([record["task"], model, workload, recipe, start] + ([fresh] if fresh else []),
                      sort_keys=True, default=str)


def repeat_groups(results: list[dict], stalled: list[dict] = ()) -> list[list[dict]]:
    """The runs of one recipe (_recipe: seeds of a recipe, or repeats of one seed, since GPU runs of one seed
    differ) evaluated alike (evaluation config but for `cuda_graphs`, the tested step, and for best.pt the
    length that chose it), in groups of two or more runs with at least one evaluated (first-seen order): its
    evaluated runs, then the runs of its recipe in `stalled` (runs.load_stalled: ended by a stall check,
    unevaluated). Runs whose record has no training config, or one this version cannot read, join no
    group."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for result in results:
        recipe = _recipe(result)
        if recipe is None:
            continue
        evaluation = {name: value for name, value in saved_evaluation(result.get("eval_config") or {}).items()
                      if name != "cuda_graphs"}  # how the steps are launched, not what they compute
        best = evaluation["checkpoint"] == "best"
        chosen_by = (result.get("workload") or {}).get("keep_best_at") if best else None
        tested = json.dumps([evaluation, result.get("train_step"), chosen_by], sort_keys=True, default=str)
        groups.setdefault((recipe, tested), []).append(result)
    for run in stalled:
        recipe = _recipe(run)
        for (group_recipe, _), group in groups.items():
            if recipe is not None and recipe == group_recipe:
                group.append(run)
    return [group for group in groups.values() if len(group) > 1]


def init_and_data_seeds(record: dict) -> tuple[int, int]:
    """A run's init seed (--seed) and data seed (TrainConfig.batch_seed)."""
    train_config = TrainConfig.from_dict(record["train_config"])
    return train_config.seed, train_config.batch_seed()


def seed_label(record: dict) -> str:
    """A run's seed for the reports: "8", or "8, data 1" where its data seed is not its init seed."""
    init, data = init_and_data_seeds(record)
    return str(init) + ("" if data == init else f", data {data}")


def _stalled_entry(run: dict) -> dict:
    """{"run", "seed", "step", "reason"} of a stopped run (runs.load_stalled) for the reports."""
    return {"run": Path(run["run_dir"]).name, "seed": run["train_config"].get("seed"),
            "step": run["stalled"]["step"], "reason": stall_reason(run["stalled"])}


def repeat_summary(group: list[dict]) -> dict:
    """{"runs", "seeds", "median", "min", "max", "stalled"} of a repeat group: exact match % per multiplier
    measured in every evaluated run of the group (the median over those runs and their range), and the
    group's runs that a stall check ended (_stalled_entry each), which those statistics leave out."""
    evaluated = [r for r in group if "stalled" not in r]
    by_run = [{_multiplier(row, r): 100 * row["exact_match"] for row in r["rows"]} for r in evaluated]
    common = sorted(set.intersection(*(set(rows) for rows in by_run)))
    values = {m: [rows[m] for rows in by_run] for m in common}
    return {"runs": [run_name(r) for r in evaluated], "seeds": [r["train_config"]["seed"] for r in evaluated],
            "median": {m: median(v) for m, v in values.items()},
            "min": {m: min(v) for m, v in values.items()}, "max": {m: max(v) for m, v in values.items()},
            "stalled": [_stalled_entry(r) for r in group if "stalled" in r]}


REPEATS_NOTE = (
    "Over repeats: runs of one recipe (the same model, data, training and evaluation but for the seed, the "
    "stall checks and what a run logs, validates and keeps of itself); the median exact match % over its "
    "evaluated runs, the lowest and highest in brackets. Runs that a stall check stopped are not evaluated "
    "and not in these statistics: where a recipe has some, its median and range leave them out.")


def _repeat_row(group: list[dict], multipliers: list[float]) -> str:
    """The repeat table's row of one group (repeat_summary)."""
    summary = repeat_summary(group)
    cells = [f"{summary['median'][m]:.1f} ({summary['min'][m]:.1f}-{summary['max'][m]:.1f})"
             if m in summary["median"] else "-" for m in multipliers]
    runs = ", ".join(f"{run_name(r)} ({seed_label(r)})" for r in group if "stalled" not in r)
    stopped = ", ".join(f"{Path(r['run_dir']).name} ({seed_label(r)})" for r in group if "stalled" in r)
    stopped = f"{len(summary['stalled'])}: {stopped}" if stopped else "-"
    return (f"| {group[0]['task']} | {method_label(group[0])} | {len(summary['runs'])}: {runs} | {stopped} | "
            f"{_samples(samples_seen(group[0]))} | " + " | ".join(cells) + " |")


def repeat_table(results: list[dict], stalled: list[dict] = ()) -> str:
    """Markdown table of the repeat groups (repeat_groups): for each multiplier the median exact match % over
    a group's evaluated runs and, in brackets, the lowest and highest, and the group's runs that a stall
    check ended; then a line for every run of `stalled` and why it stopped. "" when no two runs share a
    recipe and none stalled."""
    groups = repeat_groups(results, stalled)
    lines = []
    if groups:
        multipliers = sorted({_multiplier(row, r) for group in groups for r in group if "stalled" not in r
                              for row in r["rows"]})
        header = ["task", "method", "runs (seed)", "stopped by a stall check (seed)", "samples",
                  *(_column_name(m) for m in multipliers)]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                  *(_repeat_row(group, multipliers) for group in groups), "", REPEATS_NOTE]
    if stalled:
        grouped = {id(run) for group in groups for run in group}
        lines += ["", "Stopped by a stall check, not evaluated:"]
        for run in stalled:
            entry = _stalled_entry(run)
            lines.append(f"- {entry['run']} (seed {seed_label(run)}): {entry['reason']}"
                         + ("" if id(run) in grouped else " (no evaluated run of its recipe compared here)"))
    return "\n".join(lines) + "\n" if lines else ""


def seed_table(results: list[dict], stalled: list[dict] = ()) -> str:
    """Markdown table of the repeat groups (repeat_groups) side by side by data seed (TrainConfig.batch_seed),
    for the data seeds that two or more of them ran: each run's exact match % at the two longest lengths its
    group's evaluated runs share (a stopped run: the step it stopped at, in the first group of its recipe
    only), followed by "(init S)" where its --seed is another. Rows go by the data because that is what runs
    of one seed share across recipes: models that differ (ASEntmax's temperature projections, entmax without)
    draw their initial weights from other stretches of the seed's random stream. "" with fewer than two groups
    or no shared data seed."""
    groups = repeat_groups(results, stalled)
    if len(groups) < 2:
        return ""
    columns, placed = [], set()  # per group: its lengths and data seed -> the texts of its runs
    for group in groups:
        summary = repeat_summary(group)
        shown = sorted(summary["median"])[-2:]
        by_data = {}
        for r in group:
            if "stalled" in r:
                if id(r) in placed:
                    continue
                placed.add(id(r))
                text = f"stopped at step {r['stalled']['step']}"
            else:
                values = {_multiplier(row, r): 100 * row["exact_match"] for row in r["rows"]}
                text = " / ".join(f"{values[m]:.1f}" for m in shown)
            init, data = init_and_data_seeds(r)
            text += "" if init == data else f" (init {init})"
            by_data.setdefault(str(data), []).append(text)
        lengths = " / ".join(_column_name(m) for m in shown)
        columns.append((f"{method_label(group[0])}, recipe of {run_name(group[0])}: {lengths}", by_data))
    seeds = [seed for seed in dict.fromkeys(seed for _, by_data in columns for seed in by_data)
             if sum(seed in by_data for _, by_data in columns) > 1]
    if not seeds:
        return ""
    lines = ["By seed (the recipes above side by side, for the data seeds two or more of them ran: the same "
             "training batches and validation sets, where the initial weights differ between recipes whose "
             "models differ): exact match % at the lengths each column names, a seed's runs in one recipe "
             "separated by ';', a run initialised from another seed marked (init S)", "",
             "| data seed | " + " | ".join(label for label, _ in columns) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for seed in seeds:
        runs = ("; ".join(by_data.get(seed, [])) or "-" for _, by_data in columns)
        lines.append("| " + " | ".join([seed, *runs]) + " |")
    return "\n".join(lines) + "\n"


def run_colours(n: int) -> list:
    """n distinct colours, one per compared run: matplotlib's default ten for up to ten runs, tab20 for up to
    twenty, else evenly spaced on a continuous colormap (the default cycle repeats after ten, so an eleventh
    run took the first run's colour)."""
    import matplotlib

    if n <= 10:
        return [f"C{i}" for i in range(n)]
    if n <= 20:
        return list(matplotlib.colormaps["tab20"].colors[:n])
    cmap = matplotlib.colormaps["turbo"]
    return [cmap(i / (n - 1)) for i in range(n)]


def _draw_paper_row(ax, result: dict, colour, drawn: set) -> None:
    """The paper's row of the result's task and method, dashed in `colour`, once per (task, method): `drawn`
    holds those drawn so far."""
    paper = PAPER_RESULTS.get(result["task"], {})
    attention = result["model_config"]["attention"]
    if attention in paper and (result["task"], attention) not in drawn:
        drawn.add((result["task"], attention))
        ax.plot(paper["multipliers"], paper[attention], "--", color=colour, alpha=0.6,
                label=f"{METHOD_NAMES[attention]} (paper)")


def _legend_columns(entries: int) -> int:
    """Columns of a legend of that many lines below a figure's panels."""
    return 1 if entries <= 4 else 2 if entries <= 20 else 3


def _legend_inches(entries: int) -> float:
    """Height of a legend of that many lines below a figure's panels (fontsize 7, _legend_columns)."""
    return 0.3 + 0.17 * math.ceil(entries / _legend_columns(entries))


def _figure_width(labels: list[str]) -> float:
    """Inches of a figure with a legend of these labels below its panels: 14, or what its columns need."""
    return max(14.0, _legend_columns(len(labels)) * (0.5 + 0.055 * max(map(len, labels), default=0)))


def _legend_below(fig, ax, panel_height: float, right: float, top_inches: float, title: str | None = None):
    """The legend of `ax`'s lines below the figure's panels, in _legend_columns columns, the figure made
    panel_height inches plus the legend's height tall and as wide as its columns need (_figure_width);
    `right`: where the panels end (room for a legend of a panel's own), `top_inches`: room for the titles.
    Inside a panel, the legend of tens of runs covered the curves."""
    handles, labels = ax.get_legend_handles_labels()
    legend_inches = _legend_inches(len(labels))
    height = panel_height + legend_inches
    fig.set_size_inches(_figure_width(labels), height)
    fig.subplots_adjust(left=0.06, right=right, wspace=0.22, top=1 - top_inches / height,
                        bottom=(legend_inches + 0.65) / height)
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0),
               ncol=_legend_columns(len(labels)), fontsize=7, frameon=False, title=title, title_fontsize=7)


RIGHT_LEGEND_ENTRIES = 20  # a one-panel figure's legend beside it holds this many lines; more go below it


def _length_axes(fig, ax, ylabel: str, title: str) -> None:
    """Exact match % (0-100) against the length multiplier on a log2 axis, and the legend outside the axes
    (inside, it hid the curves): beside them for up to RIGHT_LEGEND_ENTRIES lines, else below them in columns,
    the figure made as much taller and as wide as they need (_figure_width)."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("test length / training length (ID)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(-3, 103)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    if len(ax.get_legend_handles_labels()[1]) <= RIGHT_LEGEND_ENTRIES:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
    else:
        _legend_below(fig, ax, panel_height=4.5, right=0.98, top_inches=0.45)


def _plot_accuracy(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    paper_drawn = set()  # (task, attention): each paper row once, in the colour of its method's first run
    for result, colour in zip(results, run_colours(len(results)), strict=True):
        xs = [_multiplier(row, result) for row in result["rows"]]
        ys = [100 * row["exact_match"] for row in result["rows"]]
        low = [100 * row["ci_low"] for row in result["rows"]]
        high = [100 * row["ci_high"] for row in result["rows"]]
        ax.plot(xs, ys, "o-", color=colour, label=f"{method_label(result)} ({run_name(result)})")
        ax.fill_between(xs, low, high, color=colour, alpha=0.15)
        _draw_paper_row(ax, result, colour, paper_drawn)
    tasks = ", ".join(sorted({r["task"] for r in results}))
    _length_axes(fig, ax, "exact match %", f"length generalisation: {tasks}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_repeats(results: list[dict], path: Path, stalled: list[dict] = ()) -> bool:
    """Per repeat group (repeat_groups) its median exact match against the length multiplier, the band from
    its lowest to its highest evaluated run, and the paper's row of its method; False when there is no
    group."""
    groups = repeat_groups(results, stalled)
    if not groups:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 4.5))
    paper_drawn = set()
    for group, colour in zip(groups, run_colours(len(groups)), strict=True):
        summary = repeat_summary(group)
        xs = sorted(summary["median"])
        stopped = f"; {len(summary['stalled'])} stopped" if summary["stalled"] else ""
        ax.plot(xs, [summary["median"][m] for m in xs], "o-", color=colour,
                label=f"{method_label(group[0])}: median of {summary['runs'][0]} and "
                      f"{len(summary['runs']) - 1} more{stopped}")
        ax.fill_between(xs, [summary["min"][m] for m in xs], [summary["max"][m] for m in xs], color=colour,
                        alpha=0.2)
        _draw_paper_row(ax, group[0], colour, paper_drawn)
    _length_axes(fig, ax, "exact match %: median, lowest to highest",
                 "runs of one recipe (seeds or repeats): the spread of length generalisation")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def scaled_heads_theta(result: dict, dispersion: dict) -> float | None:
    """The mean inverse temperature theta of the heads the run's normaliser scales (the NoPE heads under
    NAPE; nn.positions.scaled_head_count) over layers at the answer queries, from eval.json's
    `theta_per_head`; None for an evaluation written before it was recorded."""
    per_head = dispersion.get("theta_per_head")
    if per_head is None:
        return None
    scaled = scaled_head_count(ModelConfig.from_dict(result["model_config"]))
    values = [theta for layer in per_head for theta in layer[len(layer) - scaled:]]
    return sum(values) / len(values)


def _plot_dispersion(results: list[dict], path: Path) -> bool:
    """Normalised entropy, support size and (where recorded) the scaled heads' theta vs length per run;
    False when no run measured dispersion."""
    measured = [r for r in results if any("dispersion" in row for row in r["rows"])]
    if not measured:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thetas = {id(result): [(row["length"], scaled_heads_theta(result, row["dispersion"]))
                           for row in result["rows"] if "dispersion" in row] for result in measured}
    thetas = {key: [(x, t) for x, t in points if t is not None] for key, points in thetas.items()}
    with_theta = any(thetas.values())
    fig, axes = plt.subplots(1, 3 if with_theta else 2)
    ax_entropy, ax_support = axes[:2]
    for result, colour in zip(measured, run_colours(len(measured)), strict=True):
        rows = [row for row in result["rows"] if "dispersion" in row]
        xs = [row["length"] for row in rows]
        label = f"{method_label(result)} ({run_name(result)})"
        ax_entropy.plot(xs, [row["dispersion"]["normalised_entropy"] for row in rows], "o-", color=colour,
                        label=label)
        ax_support.plot(xs, [row["dispersion"]["support_size"] for row in rows], "o-", color=colour,
                        label=label)
        if thetas[id(result)]:
            axes[2].plot(*zip(*thetas[id(result)], strict=True), "o-", color=colour, label=label)
    ax_entropy.set_ylabel("normalised entropy H(p) / log n")
    ax_support.set_ylabel("support size |{j: p_j > 0}|")
    ax_support.set_yscale("log")
    if with_theta:
        axes[2].set_ylabel("theta of the scaled heads (1: no temperature)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("test length")
        ax.grid(alpha=0.3)
    _legend_below(fig, ax_entropy, panel_height=4.2, right=0.98, top_inches=0.55, title="colour: the run")
    fig.suptitle("attention dispersion at the answer positions (mean over layers, heads, answer queries"
                 + ("; theta over the heads the normaliser scales)" if with_theta else ")"))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def adam_floor(run_dir: Path | str) -> float | None:
    """ADAM_EPS x sqrt(the run's parameter count, config.json's n_parameters): the total gradient norm at
    which the gradient's RMS per parameter equals AdamW's eps; None where config.json does not record it."""
    config_path = Path(run_dir) / CONFIG_NAME
    n_parameters = read_json(config_path).get("n_parameters") if config_path.is_file() else None
    return ADAM_EPS * math.sqrt(n_parameters) if isinstance(n_parameters, int) and n_parameters > 0 else None


def training_curves(result: dict) -> dict | None:
    """{"samples", "loss"} of the run's training log, {"grad_norm": (samples, norm)} of its log windows that
    have one (runs.training_grad_norm; empty lists for a log without the column) with its "adam_floor", and
    {"validation": {length: (samples, exact match)}} of its validation log (samples at a logged step:
    runs.samples_trained, as in samples_seen), or None when its directory holds no usable training log."""
    run_dir = Path(result["run_dir"])
    train_config, prior = result["train_config"], result.get("prior_samples", 0)

    def samples(step):
        return samples_trained(step, train_config, prior)

    log = training_loss(run_dir)
    if not log:
        return None
    validation = {}
    for (step, length), exact_match in validation_exact_match(run_dir).items():
        at_length, matches = validation.setdefault(length, ([], []))
        at_length.append(samples(step))
        matches.append(exact_match)
    norms = training_grad_norm(run_dir)
    return {"samples": [samples(step) for step, _ in log], "loss": [loss for _, loss in log],
            "grad_norm": ([samples(step) for step, _ in norms], [norm for _, norm in norms]),
            "adam_floor": adam_floor(run_dir), "validation": validation}


def _plot_training(results: list[dict], path: Path) -> bool:
    """Training loss, the gradient norm (where a run logged it) and validation exact match vs samples seen per
    run, a panel each, one colour per run directory however many of its evaluations are compared (its
    fresh-table or best.pt evaluation share its logs: drawn again, they covered its curves and left its
    legend entry without a visible line); False when no run has its logs."""
    by_directory = {}
    for result in results:
        by_directory.setdefault(Path(result["run_dir"]).resolve(), result)
    curves = [(result, training_curves(result)) for result in by_directory.values()]
    curves = [(result, curve) for result, curve in curves if curve is not None]
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    with_norms = any(curve["grad_norm"][0] for _, curve in curves)
    fig, axes = plt.subplots(1, 3 if with_norms else 2)
    ax_loss, ax_val = axes[0], axes[-1]  # the gradient norm between them: the lengths' legend beside ax_val
    # colour = run (the legend below), line style = validation length (the same style for a length in every
    # run, so runs validated at different lengths stay comparable)
    lengths = sorted({length for _, curve in curves for length in curve["validation"]})
    styles = {length: ("-", "--", ":", "-.")[k % 4] for k, length in enumerate(lengths)}
    markers = {length: (".", "x", "+", "^")[(k // 4) % 4] for k, length in enumerate(lengths)}
    for (result, curve), colour in zip(curves, run_colours(len(curves)), strict=True):
        ax_loss.plot(curve["samples"], curve["loss"], color=colour, lw=1,
                     label=f"{method_label(result)} ({Path(result['run_dir']).name})")
        for length, (samples, matches) in sorted(curve["validation"].items()):
            ax_val.plot(samples, [100 * m for m in matches], styles[length], color=colour,
                        marker=markers[length])
        if curve["grad_norm"][0]:
            axes[1].plot(*curve["grad_norm"], color=colour, lw=1)
    if with_norms:
        floors = sorted({curve["adam_floor"] for _, curve in curves
                         if curve["grad_norm"][0] and curve["adam_floor"] is not None})
        for floor in floors:  # one line per parameter count
            axes[1].axhline(floor, color="grey", linestyle="--", lw=1)
        axes[1].set_yscale("log")
        axes[1].set_ylabel("gradient norm before clipping (log window mean)")
        axes[1].set_title("dashed: Adam's eps x sqrt(parameters)" if floors else "", fontsize=8)
    handles = [Line2D([], [], color="black", linestyle=styles[length], marker=markers[length],
                      label=f"validation length {length}") for length in lengths]
    # a loss over decades gets a log axis (a log axis of a narrower range labels its minor ticks in full,
    # wider than the margin); log.csv's zeros (losses under 5e-7, which runs before the sixty-second session
    # wrote with six decimals) are then not drawn, which the panel's title says
    losses = [loss for _, curve in curves for loss in curve["loss"]]
    positive = [loss for loss in losses if loss > 0]
    if positive and max(positive) > 10 * min(positive):
        ax_loss.set_yscale("log")
        if len(positive) < len(losses):
            ax_loss.set_title("log.csv's losses of 0 not drawn", fontsize=8)
    ax_loss.set_ylabel("training loss (nats per target token)")
    ax_val.set_ylabel("validation exact match %")
    ax_val.set_ylim(-3, 103)
    for ax in axes:
        ax.set_xlabel("training samples seen")
        ax.grid(alpha=0.3)
    _legend_below(fig, ax_loss, panel_height=4.8, right=0.86, top_inches=0.55, title="colour: the run")
    ax_val.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  title="line: the length", title_fontsize=7)
    fig.suptitle("training: loss and validation during the run")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def evaluation_labels(results: list[dict], paths: list[Path]) -> list[str]:
    """runs.run_name of each evaluation, with the path given for it (a run directory or an eval JSON) where
    two evaluations share a name (say eval.json and an --output of the same run and checkpoint)."""
    names = [run_name(result) for result in results]
    return [f"{name} ({path})" if names.count(name) > 1 else name
            for name, path in zip(names, paths, strict=True)]


def compare_runs(run_dirs, output_dir: Path | str) -> str:
    """Load and check every run's eval.json (a run directory that a stall check ended, with no evaluation:
    its config.json and stalled.json, runs.load_stalled), then write the table and plots under
    `output_dir`; returns the table. RunError when no run given is evaluated."""
    stalled, results, paths = [], [], []
    for run_dir in run_dirs:
        if stalled_unevaluated(run_dir):
            stalled.append(load_stalled(run_dir))
        else:
            results.append(load_evaluation(run_dir))
            paths.append(Path(run_dir))
    if not results:
        raise RunError("no evaluated run among those given (each was stopped by a stall check); run "
                       "`asentmax eval` on one first")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = comparison_table(results)
    paired = paired_rows(results, evaluation_labels(results, paths))
    for part in (repeat_table(results, stalled), seed_table(results, stalled), paired_table(paired)):
        if part:
            table += "\n" + part
    _plot_accuracy(results, output_dir / "accuracy.png")
    files = ["accuracy.png"]
    for name, plot in (("dispersion.png", _plot_dispersion), ("training.png", _plot_training),
                       ("repeats.png", partial(_plot_repeats, stalled=stalled))):
        if plot(results, output_dir / name):
            files.append(name)
    (output_dir / "compare.md").write_text(table + "\nPlots: " + ", ".join(files) + "\n")
    groups = [repeat_summary(group) for group in repeat_groups(results, stalled)]
    write_json(output_dir / "compare.json", {"runs": [str(d) for d in run_dirs], "results": results,
                                             "repeat_groups": groups, "paired": paired,
                                             "stalled": [_stalled_entry(run) for run in stalled]})
    return table
