"""asentmax.report's accuracy plot: one paper curve per method however many runs of it are compared, a
legend outside the axes (it hid the curves with ten runs), and a colour of its own for every run (the
default cycle gave the eleventh run the first one's)."""

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
    assert lines[0] == "| task | method | runs (seed) | samples | ID | 4x | 8x |"
    assert lines[2] == ("| reverse | ASEntmax | 5: s0 (0), s1 (1), s2 (2), s3 (3), s1 (1) | 12.8K | "
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
