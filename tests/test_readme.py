"""README's Python examples run as written, and its shell commands parse (documentation that cannot rot
silently)."""

import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index):
    exec(compile(EXAMPLES[index], f"README example {index}", "exec"), {})


def shell_commands(text: str) -> list[list[str]]:
    """The argument lists of the `asentmax ...` and `... -m asentmax ...` commands in `text`'s bash blocks,
    with line continuations joined, comments dropped, a command ended at `;`, `|`, `&` or `>`, and a shell
    variable written as `$name` read as 1."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(re.sub(r"\$\w+", "1", line), comments=True)
            for start, word in enumerate(words):
                if word == "asentmax" and (start == 0 or words[start - 1] in ("do", "-m", "then")):
                    argv = []
                    for arg in words[start + 1:]:
                        if arg in (";", "|", "||", "&&", "&") or arg.startswith((">", ";")):
                            break
                        argv.append(arg.rstrip(";"))
                        if arg.endswith(";"):
                            break
                    commands.append(argv)
    return commands


def test_shell_commands_are_read_from_bash_blocks():
    text = ("```bash\nfor s in 1 2; do asentmax train --seed $s \\\n"
            "    --steps 3; [ $? -eq 3 ] || break; done\n"
            "python -m asentmax eval runs/x --samples 4 > out.txt  # a comment\n```\n"
            "```python\nasentmax go\n```\n")
    assert shell_commands(text) == [["train", "--seed", "1", "--steps", "3"],
                                    ["eval", "runs/x", "--samples", "4"]]


def test_readme_shell_commands_parse():
    """Every asentmax command in README's bash blocks is one the CLI's parser accepts (no renamed or mistyped
    flag, no missing value)."""
    from asentmax.cli import build_parser

    commands = shell_commands(README.read_text())
    assert len(commands) >= 8 and any("--init-from" in argv for argv in commands)
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"README command does not parse: asentmax {shlex.join(argv)}")
