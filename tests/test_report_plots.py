"""asentmax.report's tables and plots: the accuracy plot (one paper curve per method however many runs of it
are compared, a legend outside the axes, a colour of its own for every run), the training and dispersion
plots' run legend below their panels, the comparison table's sample counts, and the repeat table and plot
(runs of one recipe over their seeds, with the runs a stall check stopped counted beside them)."""

import matplotlib.colors
import matplotlib.figure
import pytest

from asentmax.report import PAPER_RESULTS, _plot_accuracy, run_colours


def evaluated(name: str, attention: str, accuracy: float) -> dict:
    rows = [dict(length=64 * m, exact_match=accuracy, ci_low=accuracy / 2, ci_high=1.0) for m in (1, 4, 16)]
    return dict(run_dir=f"runs/{name}", task="mqmtar", id_length=64, rows=rows,
                model_config={"attention": attention, "position": "nape"}, workload={"task": "mqmtar"})


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The figure _plot_accuracy saves, kept open for inspection."""
    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))

    def draw(results):
        _plot_accuracy(results, tmp_path / "accuracy.png")
        return figures[-1]
    return draw


def test_each_paper_curve_is_drawn_once_in_its_methods_first_colour(drawn):
    results = [evaluated("a1", "asentmax", 0.9), evaluated("s1", "softmax", 0.5),
               evaluated("a2", "asentmax", 0.8), evaluated("a3", "asentmax", 0.7)]
    ax = drawn(results).axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels.count("ASEntmax (paper)") == 1 and labels.count("Softmax (paper)") == 1
    assert [label for label in labels if "(paper)" not in label] == [
        "ASEntmax (a1)", "Softmax (s1)", "ASEntmax (a2)", "ASEntmax (a3)"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["ASEntmax (paper)"].get_color() == lines["ASEntmax (a1)"].get_color()
    assert lines["Softmax (paper)"].get_color() == lines["Softmax (s1)"].get_color()
    paper = PAPER_RESULTS["mqmtar"]
    assert list(lines["ASEntmax (paper)"].get_ydata()) == list(paper["asentmax"])


def test_the_legend_sits_outside_the_axes(drawn):
    fig = drawn([evaluated("a1", "asentmax", 0.9)])
    fig.canvas.draw()
    legend_box = fig.axes[0].get_legend().get_window_extent()
    axes_box = fig.axes[0].get_window_extent()
    assert legend_box.x0 >= axes_box.x1


def test_a_legend_too_long_to_sit_beside_the_axes_goes_below_them_in_a_taller_figure(drawn):
    """30 runs and their paper rows: beside the axes the legend squeezed them flat and ran off the figure."""
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    long_name = "a_run_directory_named_after_everything_its_recipe_changes_" * 2  # 118 characters
    results = [evaluated(f"{long_name}{i}", ("asentmax", "softmax", "entmax")[i % 3], 0.5) for i in range(30)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = drawn(results)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    (legend,) = fig.legends
    assert fig.axes[0].get_legend() is None and len(legend.get_texts()) == 33  # 30 runs, 3 paper rows
    box = legend.get_window_extent(renderer)
    assert box.y1 < fig.axes[0].get_tightbbox(renderer).y0 and box.y0 >= 0
    assert box.x0 >= 0 and box.x1 <= fig.bbox.x1  # the figure is as wide as the legend's columns
    assert fig.axes[0].get_window_extent(renderer).height > 200  # pixels: the panel keeps its height


@pytest.mark.parametrize("n_runs", [3, 13, 25])
def test_every_run_has_a_colour_of_its_own(drawn, n_runs):
    results = [evaluated(f"r{i}", ("asentmax", "softmax", "entmax")[i % 3], 0.5) for i in range(n_runs)]
    ax = drawn(results).axes[0]
    run_lines = [line for line in ax.get_lines() if "(paper)" not in line.get_label()]
    assert len(run_lines) == n_runs
    assert len({matplotlib.colors.to_rgba(line.get_color()) for line in run_lines}) == n_runs


@pytest.mark.parametrize("n_runs", [0, 1, 10, 11, 20, 21])
def test_run_colours_gives_n_distinct_colours_across_its_three_palettes(n_runs):
    """The edges of the default cycle (10), tab20 (20) and the continuous map beyond."""
    colours = run_colours(n_runs)
    assert len(colours) == n_runs
    assert len({matplotlib.colors.to_rgba(colour) for colour in colours}) == n_runs


def test_the_table_gives_each_rows_training_and_test_samples():
    from asentmax.report import comparison_table

    ours = evaluated("a1", "asentmax", 0.9)
    for row, n in zip(ours["rows"], (100, 100, 40), strict=True):
        row["n"] = n
    ours.update(train_step=64000, train_config={"batch_size": 128})
    unknown = evaluated("s1", "softmax", 0.5)  # a file without the training record
    for row in unknown["rows"]:
        row["n"] = 7
    lines = comparison_table([ours, unknown]).splitlines()
    assert lines[0].startswith("| task | method | source | samples | test n | ID | 4x | 16x |")
    rows = {line.split(" | ")[2]: line.split(" | ")[3:5] for line in lines[2:6]}
    assert rows == {"ours (a1)": ["8.19M", "40-100"], "paper": ["50M", "1,000"], "ours (s1)": ["-", "7"]}


def test_the_table_says_how_a_tagging_task_was_scored():
    from asentmax.report import comparison_table

    def run(name, task):
        result = evaluated(name, "asentmax", 0.9)
        result.update(task=task, workload={"task": task})
        for row in result["rows"]:
            row["n"] = 10
        return result

    sequence_only = comparison_table([run("a1", "mqmtar")])
    mixed = comparison_table([run("a1", "mqmtar"), run("t1", "two_back")])
    assert "Exact match % of greedy decoding;" in sequence_only and "argmax label" not in sequence_only
    assert "Exact match % of greedy decoding (two_back: of the argmax label at every source token" in mixed


def recipe_run(name: str, seed, accuracies: dict, **train) -> dict:
    """An evaluated run of one recipe (batch 128, lr 4e-4 unless `train` says otherwise) with `seed` and the
    exact match of each multiplier in `accuracies`."""
    rows = [dict(length=64 * m, exact_match=a, ci_low=0.0, ci_high=1.0, n=300) for m, a in accuracies.items()]
    train_config = {"batch_size": 128, "lr": 4e-4, "steps": 100, **train}
    if seed is not None:
        train_config["seed"] = seed
    return dict(run_dir=f"runs/{name}", task="reverse", id_length=64, rows=rows, train_step=100,
                model_config={"vocab_size": 36, "attention": "asentmax", "position": "nape"},
                workload={"task": "reverse"},
                train_config=train_config, eval_config={"checkpoint": "last", "samples": 300})


def test_runs_of_one_recipe_are_summarised_over_their_seeds():
    """The repeat table: the median over the runs of one recipe and their range, per multiplier measured in
    all of them; a run with another learning rate, another tested checkpoint or no training record stays
    out, and two runs of one seed count as two repeats."""
    from asentmax.report import repeat_groups, repeat_summary, repeat_table

    at_4x = [0.107, 0.983, 0.933, 0.133, 0.5]
    runs = [recipe_run(f"s{seed}", seed, {1: 1.0, 4: a, 8: 0.2 * a})
            for seed, a in zip((0, 1, 2, 3, 1), at_4x, strict=True)]
    runs[2]["rows"].pop()  # seed 2 untested at 8x: the group has no 8x cell
    other_lr = recipe_run("lr", 5, {1: 1.0, 4: 0.9}, lr=1e-3)
    best = recipe_run("best", 6, {1: 1.0, 4: 0.9})
    best["eval_config"] = {"checkpoint": "best", "samples": 300}
    unrecorded = recipe_run("old", None, {1: 1.0, 4: 0.9})
    results = [runs[0], other_lr, *runs[1:], best, unrecorded]
    assert [[run["run_dir"] for run in group] for group in repeat_groups(results)] == [
        [run["run_dir"] for run in runs]]
    summary = repeat_summary(runs)
    ordered = sorted(100 * a for a in at_4x)
    assert summary["seeds"] == [0, 1, 2, 3, 1] and set(summary["median"]) == {1, 4}
    assert (summary["median"][4], summary["min"][4], summary["max"][4]) == (
        ordered[2], ordered[0], ordered[-1])
    lines = repeat_table(results).splitlines()
    assert lines[0] == ("| task | method | runs (seed) | stopped by a stall check (seed) | samples | ID | 4x "
                        "| 8x |")
    assert lines[2] == ("| reverse | ASEntmax | 5: s0 (0), s1 (1), s2 (2), s3 (3), s1 (1) | - | 12.8K | "
                        f"100.0 (100.0-100.0) | {ordered[2]:.1f} ({ordered[0]:.1f}-{ordered[-1]:.1f}) | - |")
    assert len(lines) == 5 and lines[4].startswith("Over repeats:")
    assert repeat_table([runs[0], other_lr, best, unrecorded]) == ""


def test_a_config_field_written_after_a_run_counts_at_its_default_and_graphs_do_not_split_a_recipe():
    """An older run's files lack the fields added since (they had their default's effect), and an evaluation
    with CUDA graphs gives the answers of one without: neither splits a recipe; a field set away from its
    default does, and a record this version cannot read joins no group."""
    from asentmax.report import repeat_groups
    from asentmax.trainer import TrainConfig

    default_clip = TrainConfig().grad_clip
    old = recipe_run("old", 1, {1: 1.0})
    del old["eval_config"]["checkpoint"]  # evaluated before --checkpoint existed: its last step
    new = recipe_run("new", 2, {1: 0.5}, grad_clip=default_clip)
    new["eval_config"]["cuda_graphs"] = "on"
    clipped = recipe_run("clipped", 3, {1: 0.5}, grad_clip=2 * default_clip)
    unreadable = recipe_run("future", 4, {1: 0.5}, warp_factor=9)  # a field this version does not know
    assert [[r["run_dir"] for r in group] for group in repeat_groups([old, new, clipped, unreadable])] == [
        ["runs/old", "runs/new"]]


def test_a_start_counts_by_its_recipe_where_the_record_keeps_it_else_by_its_samples():
    """Runs from --init-from weights: with prior_recipe (the start's configs) the start's recipe, not its
    sample count, joins them, its seed aside; without it (records before prior_recipe) the sample count
    does; a prior_recipe this version cannot read joins no group."""
    from asentmax.report import repeat_groups

    def started(name, seed, start_seed, prior_samples, **start_train):
        run = recipe_run(name, seed, {1: 1.0})
        start = recipe_run("start", start_seed, {1: 1.0}, **start_train)
        run.update(prior_samples=prior_samples, prior_recipe={
            key: start[key] for key in ("train_config", "workload", "model_config")})
        return run

    short, long = started("short", 1, 1, 300), started("long", 2, 2, 900)
    other_start = started("other_start", 3, 3, 300, lr=1e-3)
    unreadable = [started(f"unreadable{seed}", seed, seed, 300) for seed in (4, 5)]
    not_a_record = [started(f"not_a_record{seed}", seed, seed, 300) for seed in (6, 7)]
    for run in unreadable:
        run["prior_recipe"]["train_config"]["warp_factor"] = 9
    for run in not_a_record:
        run["prior_recipe"] = "start"
    assert [[r["run_dir"] for r in group] for group in repeat_groups(
        [short, long, other_start, *unreadable, *not_a_record])] == [["runs/short", "runs/long"]]
    old = [recipe_run(name, seed, {1: 1.0}) for name, seed in (("a", 1), ("b", 2), ("c", 3))]
    for run, prior_samples in zip(old, (300, 900, 300), strict=True):
        run["prior_samples"] = prior_samples
    assert [[r["run_dir"] for r in group] for group in repeat_groups(old)] == [["runs/a", "runs/c"]]


def test_a_data_seed_is_a_seed_not_a_recipe_and_the_tables_name_it():
    """Runs that set --data-seed apart from --seed are repeats of their recipe, labelled "init, data D";
    runs that leave it at -1 (or predate it) are labelled by their seed alone."""
    from asentmax.report import repeat_groups, repeat_table

    plain = recipe_run("s1", 1, {1: 1.0, 4: 0.9})
    swapped = recipe_run("s8_data1", 8, {1: 1.0, 4: 0.2}, data_seed=1)
    unset = recipe_run("s2", 2, {1: 1.0, 4: 0.5}, data_seed=-1)
    stopped = stopped_run("s1_data8", 1, data_seed=8)
    assert [[r["run_dir"] for r in group] for group in repeat_groups([plain, swapped, unset], [stopped])] == [
        ["runs/s1", "runs/s8_data1", "runs/s2", "runs/s1_data8"]]
    lines = repeat_table([plain, swapped, unset], [stopped]).splitlines()
    assert lines[2].startswith("| reverse | ASEntmax | 3: s1 (1), s8_data1 (8, data 1), s2 (2) | "
                               "1: s1_data8 (1, data 8) | ")
    assert lines[-1].startswith("- s1_data8 (seed 1, data 8): validation score 0.02")


def test_recipes_that_share_seeds_are_set_side_by_side_by_seed():
    """seed_table: a row per data seed that two or more recipes ran, each run's exact match at the two longest
    lengths its recipe's evaluated runs share (runs of one seed joined by ';', a stopped run by its step, in
    the first group of its recipe only, a run initialised from another seed marked so); seeds only one recipe
    ran are left out; one recipe, or none shared, gives ""."""
    from asentmax.report import seed_table

    def entmax(name, seed, accuracies, **train):
        run = recipe_run(name, seed, accuracies, **train)
        run["model_config"] = {**run["model_config"], "attention": "entmax"}
        return run

    asentmax = [recipe_run("a1", 1, {1: 1.0, 2: 1.0, 4: 0.983, 8: 0.91}),
                recipe_run("a8", 8, {1: 1.0, 2: 0.96, 4: 0.187, 8: 0.0}),
                recipe_run("a1_again", 1, {1: 1.0, 2: 1.0, 4: 0.973, 8: 0.917}),
                recipe_run("a5", 5, {1: 1.0, 2: 0.9, 4: 0.5, 8: 0.1})]
    entmaxes = [entmax("e8", 8, {1: 1.0, 2: 0.807, 4: 0.0, 8: 0.0}),
                entmax("e1", 1, {1: 1.0, 2: 1.0, 4: 0.993, 8: 0.867}),
                entmax("e6", 6, {1: 1.0, 2: 1.0, 4: 0.9, 8: 0.5})]
    stopped = [stopped_run("a3", 3),
               {**stopped_run("e3", 3, step=60), "model_config": entmaxes[0]["model_config"]}]
    lines = seed_table([*asentmax, *entmaxes], stopped).splitlines()
    assert lines[0].startswith("By seed (the recipes above side by side, for the data seeds two or more of")
    assert lines[2:] == ["| data seed | ASEntmax, recipe of a1: 4x / 8x | Entmax, recipe of e8: 4x / 8x |",
                         "|---|---|---|",
                         "| 1 | 98.3 / 91.0; 97.3 / 91.7 | 99.3 / 86.7 |",
                         "| 8 | 18.7 / 0.0 | 0.0 / 0.0 |",
                         "| 3 | stopped at step 40 | stopped at step 60 |"]
    # a run on another seed's batches goes in its data seed's row, marked with its init
    swapped = [recipe_run("a1_data8", 1, {1: 1.0, 2: 1.0, 4: 0.99, 8: 0.91}, data_seed=8),
               stopped_run("a8_data3", 8, step=50, data_seed=3)]
    lines = seed_table([*asentmax, *entmaxes, swapped[0]], [*stopped, swapped[1]]).splitlines()
    assert lines[5:] == ["| 8 | 18.7 / 0.0; 99.0 / 91.0 (init 1) | 0.0 / 0.0 |",
                         "| 3 | stopped at step 40; stopped at step 50 (init 8) | stopped at step 60 |"]
    asentmax[0]["rows"].pop()  # one run untested at 8x: its recipe's column shows the lengths all share
    lines = seed_table([*asentmax, *entmaxes]).splitlines()
    assert lines[2] == "| data seed | ASEntmax, recipe of a1: 2x / 4x | Entmax, recipe of e8: 4x / 8x |"
    assert lines[4] == "| 1 | 100.0 / 98.3; 100.0 / 97.3 | 99.3 / 86.7 |"
    # the same recipe tested two ways is two groups: a stopped run of the recipe goes in the first only
    best = [{**run, "run_dir": run["run_dir"] + "_best",
             "eval_config": {"checkpoint": "best", "samples": 300}} for run in asentmax[1:3]]
    lines = seed_table([*asentmax[1:3], *best], [stopped_run("a4", 4)]).splitlines()
    assert lines[2] == ("| data seed | ASEntmax, recipe of a8: 4x / 8x "
                        "| ASEntmax, recipe of a8_best, best.pt: 4x / 8x |")
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| 8", "| 1"]
    assert seed_table(asentmax) == ""
    assert seed_table([*asentmax, *entmaxes[2:], entmax("e7", 7, {1: 1.0})]) == ""


def test_the_repeats_plot_draws_each_recipes_median_in_a_band_from_its_lowest_to_its_highest_run(
        monkeypatch, tmp_path):
    import numpy as np

    from asentmax.report import _plot_repeats

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    at_4x = (0.1, 0.9, 0.5)
    runs = [recipe_run(f"s{seed}", seed, {1: 1.0, 2: 0.9, 4: a}) for seed, a in enumerate(at_4x)]
    assert not _plot_repeats(runs[:1], tmp_path / "repeats.png") and not figures
    assert _plot_repeats(runs, tmp_path / "repeats.png")
    ax = figures[-1].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    median = lines["ASEntmax: median of s0 and 2 more"]
    assert list(median.get_xdata()) == [1, 2, 4] and list(median.get_ydata()) == [100.0, 90.0, 50.0]
    assert list(lines["ASEntmax (paper)"].get_ydata()) == list(PAPER_RESULTS["reverse"]["asentmax"])
    (band,) = ax.collections
    at_four = band.get_paths()[0].vertices
    at_four = at_four[np.isclose(at_four[:, 0], 4)][:, 1]
    assert np.isclose(at_four.min(), 10.0) and np.isclose(at_four.max(), 90.0)
    assert _plot_repeats(runs, tmp_path / "repeats.png", stalled=[stopped_run("s9", 9)])
    labels = [line.get_label() for line in figures[-1].axes[0].get_lines()]
    assert "ASEntmax: median of s0 and 2 more; 1 stopped" in labels


def stopped_run(name: str, seed: int, step: int = 40, **train) -> dict:
    """A run of recipe_run's recipe that a validation stall check ended at `step`, as runs.load_stalled
    reads it."""
    record = recipe_run(name, seed, {}, **train)
    record["train_config"].update(stall_val_step=step, stall_val_score=0.1)
    return {key: record[key] for key in ("run_dir", "task", "train_config", "model_config", "workload")} | {
        "prior_samples": 0, "stalled": {"step": step, "score": 0.02, "stall_val_step": step,
                                        "stall_val_score": 0.1}}


def test_runs_a_stall_check_stopped_are_counted_with_their_recipe_but_not_in_its_statistics():
    """A screened seed that stopped joins the group of its recipe (a stall check is not part of a recipe: one
    that does not fire changes nothing) in its own column, outside the median and range; a stopped run of
    another recipe joins none; every stopped run gets a line saying why it stopped."""
    from asentmax.report import repeat_groups, repeat_summary, repeat_table

    runs = [recipe_run(f"s{seed}", seed, {1: 1.0, 4: a}) for seed, a in ((1, 0.98), (2, 0.93))]
    passed = recipe_run("s3", 3, {1: 1.0, 4: 0.5}, stall_val_step=40, stall_val_score=0.1)  # let through
    stopped = [stopped_run("s4", 4), stopped_run("s5", 5, step=60)]
    other = stopped_run("lr", 6, lr=1e-3)
    groups = repeat_groups([*runs, passed], [stopped[0], other, stopped[1]])
    assert [[r["run_dir"] for r in group] for group in groups] == [
        ["runs/s1", "runs/s2", "runs/s3", "runs/s4", "runs/s5"]]
    summary = repeat_summary(groups[0])
    assert summary["seeds"] == [1, 2, 3] and summary["median"][4] == 93.0
    assert (summary["min"][4], summary["max"][4]) == (50.0, 98.0)
    assert [(s["run"], s["seed"], s["step"]) for s in summary["stalled"]] == [("s4", 4, 40), ("s5", 5, 60)]
    lines = repeat_table([*runs, passed], [stopped[0], other, stopped[1]]).splitlines()
    assert lines[2].startswith("| reverse | ASEntmax | 3: s1 (1), s2 (2), s3 (3) | 2: s4 (4), s5 (5) | ")
    assert lines[-3:] == [
        "- s4 (seed 4): validation score 0.02 at step 40, below --stall-val-step 40 --stall-val-score 0.1",
        "- lr (seed 6): validation score 0.02 at step 40, below --stall-val-step 40 --stall-val-score 0.1 "
        "(no evaluated run of its recipe compared here)",
        "- s5 (seed 5): validation score 0.02 at step 60, below --stall-val-step 60 --stall-val-score 0.1"]
    # one evaluated run and its stopped seeds are a group; stopped runs alone are none
    assert len(repeat_groups(runs[:1], stopped)) == 1 and repeat_groups([], stopped) == []


def test_compare_reads_a_stopped_run_directory_and_refuses_to_compare_stopped_runs_alone(tmp_path):
    """End to end through the trainer: a run that the validation stall check ends writes stalled.json, which
    `asentmax compare` reads beside an evaluated run of the same recipe; continuing the run removes it."""
    import json

    from asentmax.cli import main
    from asentmax.runs import RunError, load_stalled
    from asentmax.train import resume_run

    tiny = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4",
            "--warmup-steps", "1", "--val-every", "2", "--val-samples", "4", "--val-multipliers", "1", "2",
            "--keep-best-at", "2", "--log-every", "2", "--checkpoint-every", "0", "--d-model", "32",
            "--n-layers", "1", "--n-heads", "2", "--d-ff", "64", "--device", "cpu", "--no-progress",
            "--steps", "4"]
    evaluated_run, stopped = tmp_path / "evaluated", tmp_path / "stopped"
    assert main(["train", "--run-dir", str(evaluated_run), *tiny, "--seed", "1"]) == 0
    assert main(["eval", str(evaluated_run), "--samples", "2", "--multipliers", "1", "2", "--no-progress",
                 "--dispersion-samples", "0"]) == 0
    with pytest.raises(SystemExit):  # no exact match reaches 1.5: stopped at step 2
        main(["train", "--run-dir", str(stopped), *tiny, "--seed", "2", "--stall-val-step", "2",
              "--stall-val-score", "1.5"])
    record = load_stalled(stopped)
    assert record["stalled"]["step"] == 2 and record["train_config"]["seed"] == 2
    assert main(["compare", str(evaluated_run), str(stopped), "--output-dir", str(tmp_path / "cmp")]) == 0
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [s["run"] for s in saved["repeat_groups"][0]["stalled"]] == ["stopped"]
    assert saved["stalled"][0]["step"] == 2 and len(saved["results"]) == 1
    assert "| 1: evaluated (1) | 1: stopped (2) |" in (tmp_path / "cmp" / "compare.md").read_text()
    with pytest.raises(RunError, match="no evaluated run among those given"):
        from asentmax.report import compare_runs
        compare_runs([stopped], tmp_path / "cmp2")
    resume_run(stopped, progress=False)  # continued past the check: no longer a stopped run
    assert not (stopped / "stalled.json").exists()


def test_what_a_run_observes_of_itself_does_not_split_a_recipe_but_the_length_that_chose_best_pt_does():
    """Validation, logging and checkpoint settings change nothing a run computes (validation samples come from
    a generator of their own), so they do not split a recipe; --keep-best-at picks the weights that an
    evaluation of best.pt tests, so there it does."""
    from asentmax.report import repeat_groups

    plain = recipe_run("plain", 1, {1: 1.0}, val_every=100)
    watched = recipe_run("watched", 2, {1: 0.5}, val_every=500, log_every=7, checkpoint_every=3)
    watched["workload"] = {"task": "reverse", "val_multipliers": [1, 8], "val_samples": 4, "keep_best_at": 8}
    other = recipe_run("other", 3, {1: 0.5}, lr=1e-3)
    assert [[r["run_dir"] for r in group] for group in repeat_groups([plain, other, watched])] == [
        ["runs/plain", "runs/watched"]]

    def best(name, seed, keep_best_at):
        result = recipe_run(name, seed, {1: 0.9})
        result["eval_config"]["checkpoint"] = "best"
        result["workload"] = {"task": "reverse", "val_multipliers": [1, 4, 8], "keep_best_at": keep_best_at}
        return result
    assert [[r["run_dir"] for r in group]
            for group in repeat_groups([best("b1", 1, 4), best("b2", 2, 4), best("b3", 3, 8)])] == [
        ["runs/b1", "runs/b2"]]


@pytest.mark.parametrize("n_runs", [1, 5, 30])
def test_the_runs_legend_of_the_training_and_dispersion_plots_sits_below_their_panels(monkeypatch, tmp_path,
                                                                                       n_runs):
    """Inside a panel, the legend of tens of runs covered the curves (and tight_layout gave up with a
    warning); below the panels, with the figure grown to hold it, it overlaps neither panel and warns of
    nothing."""
    import warnings

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from asentmax.report import _plot_dispersion, _plot_training

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    results = []
    for i in range(n_runs):
        name = "a_run_directory_named_after_everything_its_recipe_changes_" * 2 + str(i)  # 119-120 characters
        run = recipe_run(name, i, {1: 1.0, 4: 0.5})
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "log.csv").write_text("step,loss\n10,2.0\n20,1.0\n")
        (run_dir / "val.csv").write_text("step,length,exact_match\n20,64,0.5\n20,256,0.25\n")
        run["run_dir"] = str(run_dir)
        for row in run["rows"]:
            row["dispersion"] = {"normalised_entropy": 0.3, "support_size": 5.0}
            if i % 2 == 0:  # evaluations from before theta was recorded beside ones with it
                row["dispersion"]["theta_per_head"] = [[1.0] * 4 + [2.0 + row["length"] / 64] * 4]
        results.append(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for plot in (_plot_training, _plot_dispersion):
            assert plot(results, tmp_path / "plot.png")
            fig = figures[-1]
            if plot is _plot_dispersion:
                assert len(fig.axes) == 3  # entropy, support, theta
                assert len(fig.axes[2].get_lines()) == (n_runs + 1) // 2
            canvas = FigureCanvasAgg(fig)
            canvas.draw()
            renderer = canvas.get_renderer()
            (legend,) = fig.legends
            assert len(legend.get_texts()) == n_runs
            legend_box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert legend_box.y1 < ax.get_tightbbox(renderer).y0  # below the panel and its labels
            assert legend_box.y0 >= 0 and legend_box.x0 >= 0 and legend_box.x1 <= fig.bbox.x1


def test_the_scaled_heads_theta_is_the_mean_over_the_heads_the_normaliser_scales():
    from asentmax.report import scaled_heads_theta

    run = recipe_run("r", 1, {1: 1.0})
    run["model_config"]["n_heads"] = 4
    per_head = {"theta_per_head": [[1.0, 1.0, 2.0, 4.0], [1.0, 1.0, 3.0, 5.0]]}
    assert scaled_heads_theta(run, per_head) == pytest.approx(3.5)  # NAPE: the last two heads, NoPE
    run["model_config"]["position"] = "alibi"
    assert scaled_heads_theta(run, per_head) == pytest.approx(2.25)  # every head
    assert scaled_heads_theta(run, {"support_size": 3.0}) is None  # an evaluation from before theta


@pytest.mark.parametrize("stall_record, message", [
    ("{not json", "is not a readable JSON stall record"),
    ('{"score": 0.1, "stall_val_step": 4, "stall_val_score": 0.5}', "is not a stall record of asentmax"),
    ('{"step": 4}', "is not a stall record of asentmax")])
def test_a_damaged_stall_record_is_refused_in_one_line_naming_it(tmp_path, capsys, stall_record, message):
    import json

    from asentmax.cli import main

    run = tmp_path / "stopped"
    run.mkdir()
    record = recipe_run("stopped", 1, {})
    (run / "config.json").write_text(json.dumps({key: record[key] for key in
                                                 ("train_config", "model_config", "workload")}))
    (run / "stalled.json").write_text(stall_record)
    assert main(["compare", str(run), "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(run / "stalled.json") in err[0]


@pytest.mark.parametrize("losses", [(3.594, 3.588, 3.582), (2.3, 0.05, 3e-4), (2.3, 0.05, 0.0)],
                         ids=["narrow", "decades", "decades-to-a-logged-zero"])
def test_the_training_plot_keeps_every_panel_and_its_labels_inside_the_figure(monkeypatch, tmp_path, losses):
    """A loss over decades gets a log axis, also where log.csv holds a 0 (a loss under 5e-7, which runs
    before the sixty-second session wrote with six decimals: Copy's runs, whose plot then fell back to a
    linear axis that showed nothing after the first steps); a narrow one (a short or stuck run) a linear one,
    since a log axis of a narrow range labels its minor ticks in full ("3.594 x 10^0"), wider than the left
    margin, and the loss axis' labels fell off the figure; with the gradient-norm panel, three panels and
    their labels fit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from asentmax.report import _plot_training

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    run = recipe_run("a_run", 1, {1: 1.0})
    run_dir = tmp_path / "a_run"
    run_dir.mkdir()
    (run_dir / "log.csv").write_text("step,loss,grad_norm\n" + "".join(
        f"{10 * (k + 1)},{loss},{0.5 / (k + 1)}\n" for k, loss in enumerate(losses)))
    (run_dir / "val.csv").write_text("step,length,exact_match\n30,64,0.5\n")
    (run_dir / "config.json").write_text('{"n_parameters": 1000000}')
    run["run_dir"] = str(run_dir)
    assert _plot_training([run], tmp_path / "training.png")
    fig = figures[-1]
    loss_ax, norm_ax, _ = fig.axes
    positive = [loss for loss in losses if loss > 0]
    assert loss_ax.get_yscale() == ("log" if max(positive) > 10 * min(positive) else "linear")
    assert loss_ax.get_title() == ("log.csv's losses of 0 not drawn" if 0.0 in losses else "")
    assert [line.get_ydata()[0] for line in norm_ax.get_lines()[1:]] == [pytest.approx(1e-8 * 1000.0)]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_tightbbox(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (ax.get_ylabel(), box)


def test_the_training_plot_draws_a_run_once_however_many_of_its_evaluations_are_compared(monkeypatch,
                                                                                         tmp_path):
    """A run's fresh-table and best.pt evaluations share its logs: drawn once each, they covered the run's own
    curves in other colours. One colour per run directory (the first evaluation given), named by it."""
    from asentmax.report import _plot_training

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *args, **kwargs: figures.append(fig))
    evaluations = []
    for name, losses in (("first_run", "2.0,1.0"), ("second_run", "3.0,0.5")):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "log.csv").write_text("step,loss\n" + "".join(
            f"{10 * (k + 1)},{loss}\n" for k, loss in enumerate(losses.split(","))))
        (run_dir / "val.csv").write_text("step,length,exact_match\n20,64,0.5\n")
        for tables, checkpoint in (("same", "last"), ("fresh", "last"), ("same", "best")):
            evaluation = recipe_run(name, 1, {1: 1.0})
            evaluation["run_dir"] = str(run_dir)
            evaluation["eval_config"] = {"checkpoint": checkpoint, "samples": 300, "tables": tables}
            evaluations.append(evaluation)
    evaluations.insert(1, evaluations.pop())  # the second run's best.pt first among its evaluations
    assert _plot_training(evaluations, tmp_path / "training.png")
    loss_ax = figures[-1].axes[0]
    assert [list(line.get_ydata()) for line in loss_ax.get_lines()] == [[2.0, 1.0], [3.0, 0.5]]
    assert len({line.get_color() for line in loss_ax.get_lines()}) == 2
    (legend,) = figures[-1].legends
    labels = [text.get_text() for text in legend.get_texts()]
    assert labels == ["ASEntmax (first_run)", "ASEntmax (second_run)"]
