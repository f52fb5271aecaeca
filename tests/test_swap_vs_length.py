"""benchmarks/swap_vs_length.py: per run started from weights, the start's steps and attention, the count of
fresh parameters, the highest logged loss over a window of steps, the validation exact match at chosen
lengths and steps, the last step and whether a stall check stopped the run, and eval.json's exact match per
multiplier (all read back here from the run's files by brute force), and the rank-correlation table below
it; a run not started from weights, or a malformed --val-reads, is refused in one line."""

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from asentmax.cli import main as asentmax
from conftest import load_benchmark

TINY = ["--task", "reverse", "--min-length", "3", "--max-length", "6", "--batch-size", "4", "--warmup-steps",
        "1", "--log-every", "1", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
        "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A softmax start (4 steps), an ASEntmax run from it (8 steps, validated every 2 at 1x and 2x, then
    evaluated at 1x and 2x), one from it with the query projection fresh that a stall check stops at step 4,
    and the start itself (not started from weights)."""
    root = tmp_path_factory.mktemp("swap")
    start, swapped, stopped = root / "start", root / "swapped", root / "stopped"
    assert asentmax(["train", "--run-dir", str(start), *TINY, "--attention", "softmax", "--steps", "4",
                     "--val-every", "0"]) == 0
    assert asentmax(["train", "--run-dir", str(swapped), *TINY, "--attention", "asentmax", "--steps", "8",
                     "--init-from", str(start), "--val-every", "2", "--val-multipliers", "1", "2",
                     "--val-samples", "4"]) == 0
    assert asentmax(["eval", str(swapped), "--multipliers", "1", "2", "--samples", "3", "--no-progress"]) == 0
    with pytest.raises(SystemExit) as stall:  # a stall check's exit code
        asentmax(["train", "--run-dir", str(stopped), *TINY, "--attention", "asentmax", "--steps", "8",
                  "--init-from", str(start), "--init-fresh", "*.attn.wq.*", "--val-every", "0",
                  "--stall-step", "4", "--stall-loss", "1e-9"])
    assert stall.value.code == 3
    distinct = root / "distinct"  # the swapped run with values that tell each row apart
    shutil.copytree(swapped, distinct)
    rewrite_rows(distinct / "log.csv", lambda r: {**r, "loss": "5.0" if r["step"] == "6" else r["loss"]})
    rewrite_rows(distinct / "val.csv",
                 lambda r: {**r, "exact_match": str(int(r["step"]) / 100 + int(r["length"]) / 1000)})
    evaluation = json.loads((distinct / "eval.json").read_text())
    for number, row in enumerate(evaluation["rows"], 1):
        row["exact_match"] = number / 4
    (distinct / "eval.json").write_text(json.dumps(evaluation))
    return start, swapped, stopped, distinct


def rewrite_rows(path, change):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        names, rows = reader.fieldnames, [change(r) for r in reader]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


def losses(run):
    with open(run / "log.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def test_summary_reads_the_swap_the_validation_and_the_evaluation(runs, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    swap = load_benchmark("swap_vs_length")
    start, swapped, stopped, distinct = runs
    logged = losses(swapped)
    with open(swapped / "val.csv", newline="") as f:
        val = [r for r in csv.DictReader(f) if int(r["step"]) == 4 and int(r["length"]) == 12]
    evaluation = json.loads((swapped / "eval.json").read_text())
    rows = {r["length"]: r for r in evaluation["rows"]}

    s = swap.run_summary(swapped, (3, 6), [(2, 4), (2, 5)], [1, 2, 4])
    assert s["jump"] == max(loss for step, loss in logged if 3 <= step <= 6)
    assert len(val) == 1 and s["val"][2, 4] == 100 * float(val[0]["exact_match"])
    assert s["val"][2, 5] is None  # no validation at step 5
    assert (s["start_steps"], s["start_attention"], s["fresh"]) == (4, "softmax", 0)
    assert s["last_step"] == logged[-1][0] == 8 and not s["stopped"]
    assert s["exact"] == {1: 100 * rows[6]["exact_match"], 2: 100 * rows[12]["exact_match"], 4: None}
    assert swap.run_summary(swapped, (100, 200), [(2, 4)], [1])["jump"] is None  # no logged step there

    told = swap.run_summary(distinct, (3, 6), [(2, 4), (1, 6)], [1, 2])
    assert told["jump"] == 5.0  # the window's last step counts
    assert told["val"] == {(2, 4): pytest.approx(100 * (4 / 100 + 12 / 1000)),  # step 4, 2 x max-length 6
                           (1, 6): pytest.approx(100 * (6 / 100 + 6 / 1000))}
    assert told["exact"] == {1: 25.0, 2: 50.0}  # eval.json's rows at 6 and 12 tokens, in %

    halted = swap.run_summary(stopped, (1, 8), [(2, 4), (2, 5)], [1, 2, 4])
    assert halted["stopped"] and halted["last_step"] == 4 and halted["fresh"] == 1
    assert halted["jump"] == max(loss for _, loss in losses(stopped))
    assert halted["exact"] == {1: None, 2: None, 4: None}
    assert halted["val"] == {(2, 4): None, (2, 5): None}  # validated never

    text = swap.table([s, halted], [1, 2, 4], (3, 6), [(2, 4), (2, 5)], "cmd")
    assert ("| highest loss, steps 3-6 | 2x validation at step 4 | 2x validation at step 5 | ended at step "
            "| 1x | 2x | 4x |") in text
    row = f"| 1 | swapped | 4, softmax | - | {s['jump']:.3f} | {s['val'][2, 4]:.0f} | - | 8 | "
    assert row in text
    assert (f"| 2 | stopped | 4, softmax | 1 | {halted['jump']:.3f} | - | - | 4 (stopped) | - | - | - |"
            in text)

    with pytest.raises(swap.RunError, match="not started from another run's weights"):
        swap.run_summary(start, (3, 6), [(2, 4)], [1])


def test_rank_table_correlates_each_quantity_with_the_longest_length(monkeypatch):
    """The table's last section: per quantity, the runs with both values, and rank_correlation of those
    pairs against the exact match at the last multiplier (a run missing either is left out)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    swap = load_benchmark("swap_vs_length")
    from run_scatter import rank_correlation

    def summary(name, jump, early, late, short, long):
        return {"name": name, "start_steps": 10, "start_attention": "softmax", "fresh": 0, "jump": jump,
                "val": {(16, 100): early, (256, 300): late}, "last_step": 400, "stopped": False,
                "exact": {16: short, 1024: long}}

    summaries = [summary("a", 0.5, 80, 10, 100, 20), summary("b", 0.1, 60, 30, 99, 50),
                 summary("c", 0.9, None, 20, 100, 35), summary("d", 0.3, 70, None, 98, 5),
                 summary("e", 0.2, 90, 40, 97, None), summary("f", 0.7, 50, 5, 100, 10)]
    text = swap.table(summaries, [16, 1024], (200, 3000), [(16, 100), (256, 300)], "cmd")
    rank_section = text.split("against the exact match at 1024x")[1]
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")[1:]
            for line in rank_section.splitlines() if line.startswith("| ")}
    with_long = [s for s in summaries if s["exact"][1024] is not None]
    for label, key in (("highest loss, steps 200-3,000", lambda s: s["jump"]),
                       ("16x validation at step 100", lambda s: s["val"][16, 100]),
                       ("256x validation at step 300", lambda s: s["val"][256, 300])):
        pairs = [(key(s), s["exact"][1024]) for s in with_long if key(s) is not None]
        rho, p = rank_correlation([x for x, _ in pairs], [y for _, y in pairs])
        assert rows[label] == [str(len(pairs)), f"{rho:.2f}", f"{p:.2g}"]
    assert rows["256x validation at step 300"][1] == "1.00"  # late validation ranks the four runs exactly


def test_main_writes_the_table_and_plot_and_refuses_a_run_from_scratch(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    swap = load_benchmark("swap_vs_length")
    start, swapped, stopped, _ = runs
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["swap_vs_length.py", str(swapped), str(stopped), "--out", str(out),
                                      "--jump-from", "1", "--jump-to", "4", "--val-reads", "2:4", "1:6",
                                      "--lengths", "1", "2"])
    assert swap.main() == 0
    assert (out / "swap.png").stat().st_size > 0 and "| stopped | " in (out / "swap.md").read_text()
    capsys.readouterr()
    for argv, message in (([str(start)], "not started from another run's weights"),
                          ([str(tmp_path / "absent")], "not a run directory"),
                          ([str(swapped), "--val-reads", "16"], "expected M:S"),
                          ([str(swapped), "--val-reads", "0:100"], "M and S must be >= 1"),
                          ([str(swapped), "--jump-from", "5", "--jump-to", "4"], "--jump-from must be")):
        monkeypatch.setattr(sys, "argv", ["swap_vs_length.py", *argv, "--out", str(tmp_path / "refused")])
        with pytest.raises(SystemExit) as exit_info:
            swap.main()
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()[-1]) > 0
    assert not (tmp_path / "refused").exists()
