"""`make demo` (asentmax.demo): the pipeline end to end on a tiny budget (both runs train, evaluate and
are compared, then published into a stand-in checkout), the default output directory is ignored by git,
and README's demo table is the one in the committed results/demo files."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from asentmax import demo

ROOT = Path(__file__).resolve().parent.parent


def test_demo_pipeline_writes_table_plots_and_summary_and_publishes(tmp_path, monkeypatch):
    monkeypatch.setitem(demo.DEMO_EVAL, "multipliers", ("1", "1.5"))
    monkeypatch.setitem(demo.DEMO_EVAL, "samples", 4)
    monkeypatch.setattr(demo, "POLL_S", 0.2)  # the children take seconds here, not minutes
    checkout = tmp_path / "checkout"
    (checkout / demo.PUBLISHED_DIR).mkdir(parents=True)
    (checkout / demo.PUBLISHED_DIR / "README.md").write_text("kept")
    (checkout / "README.md").write_text(f"intro\n{demo.README_BEGIN}\nold table\n{demo.README_END}\nrest\n")
    output = tmp_path / "out"
    table = demo.run_demo(output, steps=10, publish_root=checkout)
    methods = [line.split(" | ")[1] for line in table.splitlines() if "| ours" in line]
    assert methods == ["Softmax", "ASEntmax"]
    summary = json.loads((output / "demo.json").read_text())
    assert summary["train"]["steps"] == 10 and summary["eval"]["samples"] == 4
    for name in ("demo.md", "compare.md", "accuracy.png"):
        assert (output / name).stat().st_size > 0
    for method in demo.DEMO_METHODS:
        evaluation = json.loads((output / f"{demo.DEMO_TASK}_{method}" / "eval.json").read_text())
        assert [row["length"] for row in evaluation["rows"]] == [16, 24]
        assert (output / f"{demo.DEMO_TASK}_{method}" / "checkpoint.pt").is_file()
    # published: everything but the checkpoints, and README's table rewritten from the published files
    published = checkout / demo.PUBLISHED_DIR
    assert sorted(p.relative_to(published) for p in published.rglob("*") if p.is_file()) == sorted(
        [p.relative_to(output) for p in output.rglob("*") if p.is_file() and p.suffix != ".pt"]
        + [Path("README.md")])
    assert (published / "README.md").read_text() == "kept"
    block = demo.readme_demo_block(json.loads((published / "compare.json").read_text()),
                                   json.loads((published / "demo.json").read_text()))
    readme = (checkout / "README.md").read_text()
    assert readme == f"intro\n{demo.README_BEGIN}\n{block}\n{demo.README_END}\nrest\n"
    assert "| Softmax | " in block and "| 1x | 1.5x |" in block


def test_readme_demo_table_is_the_committed_result():
    compare = json.loads((ROOT / demo.PUBLISHED_DIR / "compare.json").read_text())
    summary = json.loads((ROOT / demo.PUBLISHED_DIR / "demo.json").read_text())
    expected = demo.readme_demo_block(compare, summary)
    assert demo.readme_demo_section((ROOT / "README.md").read_text()) == expected, (
        "README.md's demo table differs from results/demo; run `make demo-results`")
    # and the committed table agrees with the run directories' own eval.json files
    for result in compare["results"]:
        run = ROOT / demo.PUBLISHED_DIR / Path(result["run_dir"]).name
        assert json.loads((run / "eval.json").read_text())["rows"] == result["rows"]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs a git checkout")
def test_default_demo_output_is_ignored_by_git():
    probe = f"{demo.DEFAULT_OUTPUT}/{demo.DEMO_TASK}_softmax/eval.json"
    result = subprocess.run(["git", "check-ignore", "-q", probe], cwd=ROOT, timeout=30)
    assert result.returncode == 0, f"{probe} is not ignored by git"


def test_publish_needs_a_checkout(tmp_path):
    with pytest.raises(ValueError, match="demo table markers"):
        demo.check_publish_target(tmp_path)
    (tmp_path / "README.md").write_text(f"{demo.README_BEGIN}\n{demo.README_END}\n")
    with pytest.raises(ValueError, match="results/demo"):
        demo.check_publish_target(tmp_path)
