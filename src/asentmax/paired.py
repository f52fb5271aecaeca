"""Paired comparison of evaluations that tested the same samples: `asentmax compare`'s "Paired" table.

Two evaluations tested the same samples at a length when their rows there carry the same test_set_digest
(asentmax.tasks.eval_sets.eval_set_digest, which `asentmax eval` keeps per length beside exact_by_sample:
docs/method.md section 7). Their exact matches then differ only by the discordant samples, right in one and
wrong in the other. McNemar's exact test asks whether those split more unevenly than a fair coin would split
them: the two-sided binomial p of the smaller count among the discordant at probability 1/2 (McNemar 1947;
the exact form for small counts). That is the test for the last against the best checkpoint, bf16 against
fp32, or a probe's conditions, where two Wilson intervals of one test set overlap and say little.
"""

from __future__ import annotations

import math

from asentmax.runs import run_name


def mcnemar_exact_p(only_first: int, only_second: int) -> float:
    """Two-sided exact McNemar p: 2 P(X <= min) for X ~ Binomial(only_first + only_second, 1/2), at most 1
    (1 when no sample is discordant)."""
    if only_first < 0 or only_second < 0:
        raise ValueError(f"discordant counts must be >= 0, got {only_first} and {only_second}")
    n = only_first + only_second
    tail = sum(math.comb(n, k) for k in range(min(only_first, only_second) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def paired_rows(results: list[dict], labels: list[str] | None = None) -> list[dict]:
    """Each evaluation (in the order given) against the first one given that tested the same samples, at
    every length where both rows hold exact_by_sample and one test_set_digest (so n evaluations of one test
    set give n - 1 rows a length, not every pair): the two names (`labels`, by default runs.run_name), the
    length, the samples, each one's exact match, the samples right only in the first and only in the second,
    and mcnemar_exact_p."""
    labels = [run_name(result) for result in results] if labels is None else labels
    first_by_set: dict[tuple, tuple[str, dict]] = {}  # (length, digest) -> the first (label, row)
    rows = []
    for result, label in zip(results, labels, strict=True):
        for row in result["rows"]:
            key = (row["length"], row.get("test_set_digest"))
            if key[1] is None or "exact_by_sample" not in row:
                continue
            if key not in first_by_set:
                first_by_set[key] = (label, row)
                continue
            first, first_row = first_by_set[key]
            pairs = list(zip(first_row["exact_by_sample"], row["exact_by_sample"], strict=True))
            only_first = sum(a and not b for a, b in pairs)
            only_second = sum(b and not a for a, b in pairs)
            rows.append({"first": first, "second": label, "length": row["length"],
                         "n": len(pairs), "first_exact_match": first_row["exact_match"],
                         "second_exact_match": row["exact_match"], "only_first": only_first,
                         "only_second": only_second, "p": mcnemar_exact_p(only_first, only_second)})
    return rows


def paired_table(rows: list[dict]) -> str:
    """paired_rows as markdown with a line saying what it holds; "" when there are none."""
    if not rows:
        return ""
    lines = ["Paired: each evaluation against the first one given that tested the same samples (the same "
             "test-set digest at a length): exact match % of each, the samples right only in the first and "
             "only in the second, and the two-sided exact McNemar p of that split (asentmax/paired.py).", "",
             "| first | second | length | n | first % | second % | only first | only second | p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['first']} | {row['second']} | {row['length']} | {row['n']} | "
                     f"{100 * row['first_exact_match']:.1f} | {100 * row['second_exact_match']:.1f} | "
                     f"{row['only_first']} | {row['only_second']} | {row['p']:.3g} |")
    return "\n".join(lines) + "\n"
