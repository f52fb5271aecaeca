"""The attention normalisers, each defined once (arXiv:2506.16640, section 2; docs/method.md).

A normaliser maps a query's logits z (theta * scale * q.k + position bias, over the visible keys) to
attention weights p. Every place that depends on the choice reads this table: ModelConfig validation and
the CLI choices (nn/config.py ATTENTIONS), the attention layer (nn/attention.py: which kernel, which alpha),
the inverse-temperature module (nn/temperature.py), the attention statistics, the dispersion illustration
(dispersion.py) and the paper's method names in reports (report.py).

Fields:
  family       how p comes from z: "softmax" (p = softmax(z)), "entmax" (p = alpha-entmax(z)) or "topk"
               (softmax over each query's topk_k largest logits);
  temperature  None, or the inverse-temperature module that scales z per query (nn/temperature.py
               TEMPERATURES: "ssmax" = s_h log(n+1) (+ delta), "asentmax" = delta + beta log(n+1)^gamma);
  sdpa         True: computed by torch scaled_dot_product_attention (the plain-torch softmax path);
  fixed_alpha  entmax family: None = ModelConfig.alpha, else this alpha;
  label        the method's name in the paper's tables;
and the ModelConfig fields that set some normalisers' weights only (PARAMETERS, `Normaliser.reads`): alpha
(the entmax family without a fixed alpha), topk_k (the top-k family), the temperature's theta_delta (SSMax and
ASEntmax), gamma_range, asentmax_beta_init and asentmax_gamma_init (ASEntmax), ssmax_form and ssmax_s_init
(SSMax); `asentmax train` refuses a flag for
one that the chosen normaliser does not read. asentmax_init is not among them: it belongs to the paper code's
block options (presets.PAPER_CODE_BLOCKS), which its commands give to every method alike.

SSMax runs through the fused kernel's softmax mode (sdpa False), not SDPA: with SDPA, torch.compile + Inductor
gave the gradient of its s wrong on the H200 (torch 2.11) in a compiled model for each of three forms
of theta (by up to 2.8e6 relative), while the kernel's route, which returns d theta itself as ASEntmax's
does, compiled right (benchmarks/diagnose_ssmax_compile.py; results/gpu_tests_session8.md).

To add a normaliser, add one entry to NORMALISERS (and tests). A new family needs its weights in
`Normaliser.probabilities` and its kernel choice in nn/attention.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asentmax.ops.entmax import entmax

FAMILIES = ("softmax", "entmax", "topk")
# ModelConfig fields that only some normalisers read (Normaliser.reads)
PARAMETERS = ("alpha", "topk_k", "theta_delta", "gamma_range", "asentmax_beta_init", "asentmax_gamma_init",
              "ssmax_form", "ssmax_s_init")


@dataclass(frozen=True)
class Normaliser:
    name: str
    label: str
    family: str
    temperature: str | None = None
    sdpa: bool = False
    fixed_alpha: float | None = None

    def alpha(self, config_alpha: float) -> float:
        """The alpha of the kernel that computes it: 1 for the softmax and top-k families."""
        if self.family != "entmax":
            return 1.0
        return config_alpha if self.fixed_alpha is None else self.fixed_alpha

    @property
    def takes_config_alpha(self) -> bool:
        """True when ModelConfig.alpha is its alpha (and must then be > 1)."""
        return self.family == "entmax" and self.fixed_alpha is None

    def reads(self, parameter: str) -> bool:
        """Whether ModelConfig field `parameter` (one of PARAMETERS) changes its weights: alpha when it takes
        the config's alpha, topk_k for the top-k family, theta_delta with a temperature, the others with
        their own temperature (the prefix of their name)."""
        if parameter == "alpha":
            return self.takes_config_alpha
        if parameter == "topk_k":
            return self.family == "topk"
        if parameter == "theta_delta":
            return self.temperature is not None
        if parameter in ("gamma_range", "asentmax_beta_init", "asentmax_gamma_init"):
            return self.temperature == "asentmax"
        if parameter in ("ssmax_form", "ssmax_s_init"):
            return self.temperature == "ssmax"
        raise ValueError(f"{parameter!r} is not one of {PARAMETERS}")

    def probabilities(self, z: torch.Tensor, alpha: float, topk_k: int,
                      backend: str = "auto") -> torch.Tensor:
        """Dense weights p from logits z (..., Nk), -inf on hidden keys; alpha as `alpha()` returned.
        `backend` is the model's attention backend: "reference" and "chunked" keep entmax in pure torch."""
        if self.family == "topk":
            return topk_probabilities(z, topk_k)
        if self.family == "entmax":
            pure_torch = backend in ("reference", "chunked")
            return entmax(z, alpha=alpha, dim=-1, backend="reference" if pure_torch else "auto")
        return torch.softmax(z, dim=-1)


def topk_probabilities(z: torch.Tensor, k: int) -> torch.Tensor:
    """Softmax over each row's k largest logits (all of them when the row is shorter than k)."""
    if k < z.shape[-1]:
        keep = torch.zeros_like(z, dtype=torch.bool).scatter_(-1, z.topk(k, dim=-1).indices, True)
        z = z.masked_fill(~keep, float("-inf"))
    return torch.softmax(z, dim=-1)


NORMALISERS = (
    Normaliser("softmax", "Softmax", "softmax", sdpa=True),
    Normaliser("ssmax", "SSMax", "softmax", temperature="ssmax"),
    Normaliser("topk", "Top-K", "topk"),
    Normaliser("entmax", "Entmax", "entmax"),
    Normaliser("asentmax", "ASEntmax", "entmax", temperature="asentmax"),
)
NAMES = tuple(n.name for n in NORMALISERS)
_BY_NAME = {n.name: n for n in NORMALISERS}
assert len(_BY_NAME) == len(NORMALISERS)
assert all(n.family in FAMILIES and (not n.sdpa or n.family == "softmax") for n in NORMALISERS)


def get_normaliser(name: str) -> Normaliser:
    """The normaliser called `name`; ValueError naming the known ones otherwise."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown attention normaliser {name!r}; expected one of {', '.join(NAMES)}")
    return _BY_NAME[name]
