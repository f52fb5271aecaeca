"""Attention dispersion as the context grows: softmax vs SSMax vs entmax vs ASEntmax-style scaling.

A numerical illustration of arXiv:2506.16640, section 1: with a fixed set of relevant tokens among n - k
irrelevant ones, softmax's normalised entropy H(p) / log n drifts towards 1 and the mass on the
relevant tokens leaks away as n grows, while alpha-entmax keeps exact zeros, so its support and
entropy stay bounded. Scaling the logits by theta = delta + beta * log(n + 1) ** gamma (the ASEntmax
inverse temperature of arXiv:2506.16640, section 2, here with fixed beta and gamma) counteracts the growth
of the irrelevant tail; SSMax applies the same idea to softmax. The methods are the softmax- and
entmax-family normalisers of asentmax.nn.normalisers, those with a temperature module scaled by theta(n).

Run: ``python -m asentmax.dispersion`` (writes results/dispersion.{md,json,png}).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from asentmax.nn.normalisers import NORMALISERS, get_normaliser


@dataclass(frozen=True)
class DispersionSetup:
    """Logits: ``n_relevant`` tokens at ``relevant_logit``, the rest i.i.d. N(0, ``noise_std``^2)."""

    n_relevant: int = 4
    relevant_logit: float = 5.0
    noise_std: float = 1.0
    trials: int = 32
    alpha: float = 1.5
    delta: float = 1.0
    beta: float = 0.25
    gamma: float = 1.0
    seed: int = 0


METHODS = tuple(n.name for n in NORMALISERS if n.family in ("softmax", "entmax"))
SPARSE_METHODS = tuple(n.name for n in NORMALISERS if n.family == "entmax")  # their support is reported


def inverse_temperature(n: int, setup: DispersionSetup) -> float:
    """theta(n) = delta + beta * log(n + 1) ** gamma (arXiv:2506.16640, section 2, fixed beta and gamma)."""
    return setup.delta + setup.beta * math.log(n + 1) ** setup.gamma


def sample_logits(n: int, setup: DispersionSetup, generator: torch.Generator) -> torch.Tensor:
    """(trials, n) logits in fp64; the first ``n_relevant`` columns are the relevant tokens."""
    logits = torch.randn(setup.trials, n, generator=generator, dtype=torch.float64) * setup.noise_std
    logits[:, : setup.n_relevant] = setup.relevant_logit
    return logits


def attention_weights(method: str, logits: torch.Tensor, setup: DispersionSetup) -> torch.Tensor:
    """The weights of normaliser `method` (one of METHODS) on logits (..., n), scaled by theta(n) when
    the normaliser has an inverse temperature."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    normaliser = get_normaliser(method)
    if normaliser.temperature is not None:
        logits = inverse_temperature(logits.shape[-1], setup) * logits
    return normaliser.probabilities(logits, normaliser.alpha(setup.alpha), topk_k=logits.shape[-1])


def dispersion_stats(p: torch.Tensor, n_relevant: int) -> dict[str, float]:
    """Mean normalised entropy, support size and mass on the relevant tokens over the trials."""
    n = p.shape[-1]
    plogp = torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))
    entropy = -plogp.sum(-1)
    return {
        "normalised_entropy": (entropy / math.log(n)).mean().item(),
        "support": (p > 0).sum(-1).double().mean().item(),
        "relevant_mass": p[:, :n_relevant].sum(-1).mean().item(),
    }


def run(lengths: list[int], setup: DispersionSetup) -> list[dict]:
    generator = torch.Generator().manual_seed(setup.seed)
    rows = []
    for n in lengths:
        if n <= setup.n_relevant:
            raise ValueError(f"length {n} must exceed n_relevant={setup.n_relevant}")
        logits = sample_logits(n, setup, generator)
        for method in METHODS:
            stats = dispersion_stats(attention_weights(method, logits, setup), setup.n_relevant)
            rows.append({"n": n, "method": method, **stats})
    return rows


def markdown_table(rows: list[dict], setup: DispersionSetup) -> str:
    lengths = sorted({r["n"] for r in rows})
    by_key = {(r["n"], r["method"]): r for r in rows}
    header = "| n | " + " | ".join(f"{m} H/log n" for m in METHODS) + " | "
    header += " | ".join(f"{m} relevant mass" for m in METHODS) + " | "
    header += " | ".join(f"{m} support" for m in SPARSE_METHODS) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(METHODS) + len(SPARSE_METHODS))]
    for n in lengths:
        cells = [f"{by_key[n, m]['normalised_entropy']:.3f}" for m in METHODS]
        cells += [f"{by_key[n, m]['relevant_mass']:.3f}" for m in METHODS]
        cells += [f"{by_key[n, m]['support']:.1f}" for m in SPARSE_METHODS]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    caption = (
        f"{setup.n_relevant} relevant tokens at logit {setup.relevant_logit}, "
        f"the rest N(0, {setup.noise_std}^2); "
        f"alpha = {setup.alpha}; theta(n) = {setup.delta} + {setup.beta} * log(n+1)^{setup.gamma}; "
        f"mean over {setup.trials} draws."
    )
    return caption + "\n\n" + "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in METHODS:
        mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["n"])
        ns = [r["n"] for r in mine]
        axes[0].plot(ns, [r["normalised_entropy"] for r in mine], marker="o", label=method)
        axes[1].plot(ns, [r["relevant_mass"] for r in mine], marker="o", label=method)
    axes[0].set_ylabel("normalised entropy H(p) / log n")
    axes[1].set_ylabel("attention mass on the relevant tokens")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length n")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Attention dispersion as the context grows")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-log2-length", type=int, default=16, help="largest n is 2**this (default 16)")
    parser.add_argument("--trials", type=int, default=DispersionSetup.trials, help="random draws per length")
    parser.add_argument("--out", type=Path, default=Path("results"), help="output directory")
    args = parser.parse_args(argv)
    if not 7 <= args.max_log2_length <= 20:
        parser.error("--max-log2-length must be between 7 and 20")
    setup = DispersionSetup(trials=args.trials)
    lengths = [2**e for e in range(6, args.max_log2_length + 1, 2)]
    rows = run(lengths, setup)
    table = markdown_table(rows, setup)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m asentmax.dispersion " + " ".join(argv if argv is not None else [])
    (args.out / "dispersion.md").write_text(f"Command: `{command.strip()}`\n\n{table}")
    (args.out / "dispersion.json").write_text(json.dumps({"setup": asdict(setup), "rows": rows}, indent=1))
    plot(rows, args.out / "dispersion.png")
    print(f"wrote {args.out / 'dispersion.md'} and {args.out / 'dispersion.png'}")


if __name__ == "__main__":
    main()
