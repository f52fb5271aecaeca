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
