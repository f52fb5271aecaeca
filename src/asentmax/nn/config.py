"""ModelConfig: every architectural choice of the decoder-only Transformer, validated on construction.

The attention normalisers and position schemes are those of arXiv:2506.16640, section 2:
  attention: a name of nn/normalisers.py NORMALISERS (each normaliser is defined there, once)
  position:  nope | alibi | rope | nape (first H/2 heads ALiBi, the rest NoPE; scaling on NoPE heads only)
The block design defaults to Llama-style pre-norm blocks; norm_placement="sandwich", mlp="geglu",
scale_embeddings, scaled_residual_init=False, tie_embeddings=False and norm_eps=1e-6 reproduce the Gemma-2
blocks of the paper's code (arXiv:2506.16640, section 4 and its code; results/paper/README.md), and
asentmax_init="normal" its init; presets.PAPER_CODE_BLOCKS bundles these. Its frozen zero embedding
(zero_embedding_id) is task-specific, so not in the bundle.
Every default lives here, once. Presets (presets.py) are plain functions that override fields.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from asentmax.nn.normalisers import NAMES as ATTENTIONS
from asentmax.nn.normalisers import get_normaliser
from asentmax.ops.entmax import ALPHA_MAX
from asentmax.ops.types import BACKENDS

POSITIONS = ("nope", "alibi", "rope", "nape")
MLPS = ("swiglu", "geglu", "gelu")
NORM_PLACEMENTS = ("pre", "sandwich")
ALIBI_SLOPES = ("harmonic", "geometric")
ASENTMAX_INITS = ("zero", "reference", "normal")
SSMAX_FORMS = ("delta", "plain")
# the fields that belong to the attention normaliser: a model of another normaliser can start from this one's
# weights (`asentmax train --init-from`) when only these differ
NORMALISER_FIELDS = ("attention", "alpha", "topk_k", "theta_delta", "gamma_range", "asentmax_init",
                     "asentmax_beta_init", "asentmax_gamma_init", "ssmax_form", "ssmax_s_init")
# the allowed values of every field with a fixed set of them (validation below, the CLI's choices)
CHOICES = {"attention": ATTENTIONS, "position": POSITIONS, "mlp": MLPS, "alibi_slopes": ALIBI_SLOPES,
           "asentmax_init": ASENTMAX_INITS, "ssmax_form": SSMAX_FORMS, "attention_backend": BACKENDS,
           "norm_placement": NORM_PLACEMENTS}


def _field(default, help: str):
    """A dataclass field with its help text (the CLI builds its flags from these)."""
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    vocab_size: int = field(metadata={"help": "vocabulary size (token ids 0 .. vocab_size-1)"})
    d_model: int = _field(256, "hidden size")
    n_layers: int = _field(2, "number of Transformer blocks")
    n_heads: int = _field(8, "attention (query) heads; must divide d_model")
    n_kv_heads: int | None = _field(None, "key/value heads for grouped-query attention; None = n_heads")
    d_ff: int = _field(1024, "MLP hidden size")
    mlp: str = _field(
        "swiglu", "MLP: swiglu = down(silu(gate x) * up x) (Llama) | geglu = down(gelu_tanh(gate x) * up x) "
        "(Gemma-2, the paper's code) | gelu = down(gelu(up x))")
    norm_placement: str = _field(
        "pre", "RMSNorm in each block: pre = x + f(norm(x)) (Llama) | sandwich = x + norm(f(norm(x))), "
        "a second RMSNorm on the attention and MLP outputs (Gemma-2, the paper's code)")
    scale_embeddings: bool = _field(
        False, "multiply the token embeddings by sqrt(d_model) (Gemma-2, the paper's code)")
    attention: str = _field("asentmax", f"attention normaliser: {' | '.join(ATTENTIONS)}")
    alpha: float = _field(1.5, f"alpha of alpha-entmax (entmax, asentmax), in (1, {ALPHA_MAX:g}]; 1.5 in the "
                               "paper")
    topk_k: int = _field(32, "topk: softmax over each query's k largest logits (32 in the paper's Sort runs)")
    position: str = _field("nape", "positions: nope | alibi | rope | nape (first H/2 heads ALiBi, rest NoPE)")
    alibi_slopes: str = _field(
        "harmonic", "slopes of the m ALiBi heads: harmonic = 1, 1/2, ..., 1/m (the paper's NAPE code) | "
        "geometric = 2^(-8 i/m) (Press et al.)")
    rope_base: float = _field(10000.0, "RoPE base")
    theta_delta: float = _field(1.0, "delta in theta = delta + ... (ASEntmax, SSMax delta form); paper: 1")
    gamma_range: float = _field(2.0, "s in gamma = s tanh(w_gamma . x + b) (ASEntmax); 2 in the paper")
    # Default "zero" is provisional: an independent reproduction of the paper reportedly escaped the MQMTAR
    # plateau only with zero-initialised projections; to be confirmed by measurement.
    asentmax_init: str = _field(
        "zero", "ASEntmax beta/gamma projections' weights at init: zero (beta = log 2, gamma = 0 everywhere "
        "with the default biases) | reference (nn.Linear's random weights: beta ~ softplus(0), gamma ~ 0) | "
        "normal (normal(0, init_std): transformers' init, the paper's code); their biases are set by "
        "asentmax_beta_init and asentmax_gamma_init (0 by default)")
    asentmax_beta_init: float | None = _field(
        None, "ASEntmax: beta where the projection's weights give 0 (its bias is set to softplus^-1 of "
        "this); None = log 2 (bias 0). With asentmax_gamma_init 1, beta 1 starts ASEntmax at theta = "
        "delta + log(n+1), the length scaling that SSMax starts from")
    asentmax_gamma_init: float = _field(
        0.0, "ASEntmax: gamma where the projection's weights give 0 (its bias is set to atanh(this / "
        "gamma_range)); in (-gamma_range, gamma_range); 0: the paper's, theta independent of n at the start")
    ssmax_form: str = _field("delta", "SSMax: delta (theta = delta + s_h log(n+1), the paper's runs) | "
                                      "plain (theta = s_h log(n+1))")
    ssmax_s_init: float | None = _field(
        None, "initial SSMax s_h; None = 0 for the delta form (starts as softmax), 1/log(65) for the plain "
        "form (theta = 1 at length 64)")
    tie_embeddings: bool = _field(True, "share the input embedding and the output head")
    zero_embedding_id: int | None = _field(
        None, "a token id whose embedding is 0 at init and never trained (torch's padding_idx; needs an "
        "untied head). The paper's code has it for id 0 (Gemma-2's pad_token_id), its MQMTAR blank "
        "(ours is id 4)")
    dropout: float = _field(0.0, "dropout on embeddings and residual branches")
    norm_eps: float = _field(1e-5, "RMSNorm epsilon")
    init_std: float = _field(0.02, "std of the normal init of every Linear and Embedding weight")
    scaled_residual_init: bool = _field(
        True, "init the residual-branch outputs (attention output, MLP down projection) with std init_std "
        "/ sqrt(2 n_layers) (GPT-2); false: init_std as every other weight (transformers' init, the paper's "
        "code)")
    attention_backend: str = _field(
        "auto", "entmax_attention backend for entmax/asentmax (and long-context softmax/ssmax): "
        + " | ".join(BACKENDS))

    def __post_init__(self):
        def need(cond: bool, message: str):
            if not cond:
                raise ValueError(f"ModelConfig: {message}")

        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "topk_k"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                 f"{name} must be a positive int, got {value!r}")
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            need(value in allowed, f"unknown {name} {value!r}; expected one of {', '.join(allowed)}")
        need(self.d_model % self.n_heads == 0,
             f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if self.n_kv_heads is not None:
            need(isinstance(self.n_kv_heads, int) and self.n_kv_heads >= 1,
                 f"n_kv_heads must be a positive int or None, got {self.n_kv_heads!r}")
            need(self.n_heads % self.n_kv_heads == 0,
                 f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads} "
                 "(grouped-query attention)")
        normaliser = get_normaliser(self.attention)
        if normaliser.takes_config_alpha:
            need(math.isfinite(self.alpha) and self.alpha > 1,
                 f"alpha must be > 1 for attention={self.attention!r}, got {self.alpha!r} "
                 "(alpha = 1 is softmax: use attention='softmax')")
            need(self.alpha <= ALPHA_MAX,
                 f"alpha must be <= {ALPHA_MAX:g} for attention={self.attention!r} (the range "
                 f"alpha-entmax supports), got {self.alpha!r}")
        if self.position == "nape":
            need(self.n_heads >= 2 and self.n_heads % 2 == 0,
                 f"position='nape' splits heads in two halves (ALiBi / NoPE): n_heads must be even, "
                 f"got {self.n_heads}")
        if self.position == "rope":
            need(self.head_dim % 2 == 0, f"position='rope' needs an even head_dim, got {self.head_dim}")
            need(self.rope_base > 1, f"rope_base must be > 1, got {self.rope_base!r}")
        need(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout!r}")
        need(self.gamma_range > 0, f"gamma_range must be > 0, got {self.gamma_range!r}")
        need(math.isfinite(self.theta_delta) and self.theta_delta >= 0,
             f"theta_delta must be finite and >= 0, got {self.theta_delta!r}")
        beta_init = self.asentmax_beta_init
        need(beta_init is None or (isinstance(beta_init, (int, float)) and math.isfinite(beta_init)
                                   and 0 < beta_init <= 100),
             f"asentmax_beta_init must be in (0, 100] (beta = softplus(.) > 0) or None, got {beta_init!r}")
        need(isinstance(self.asentmax_gamma_init, (int, float))
             and abs(self.asentmax_gamma_init) < self.gamma_range,
             f"asentmax_gamma_init must be inside (-gamma_range, gamma_range) = (-{self.gamma_range:g}, "
             f"{self.gamma_range:g}) (gamma = gamma_range tanh(.)), got {self.asentmax_gamma_init!r}")
        if normaliser.temperature == "ssmax" and self.ssmax_form == "plain":
            need(self.ssmax_s_init is None or self.ssmax_s_init > 0,
                 f"plain-form SSMax needs ssmax_s_init > 0 (theta = s log(n+1)), got {self.ssmax_s_init!r}")
        need(self.norm_eps > 0, f"norm_eps must be > 0, got {self.norm_eps!r}")
        need(self.init_std > 0, f"init_std must be > 0, got {self.init_std!r}")
        for name in ("scale_embeddings", "scaled_residual_init"):
            value = getattr(self, name)
            need(isinstance(value, bool), f"{name} must be true or false, got {value!r}")
        zero_id = self.zero_embedding_id
        if zero_id is not None:
            need(isinstance(zero_id, int) and not isinstance(zero_id, bool)
                 and 0 <= zero_id < self.vocab_size,
                 f"zero_embedding_id must be a token id in [0, {self.vocab_size}), got {zero_id!r}")
            need(not self.tie_embeddings,
                 "zero_embedding_id needs tie_embeddings=False (a tied head would train that embedding)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ssmax_initial_s(self) -> float:
        if self.ssmax_s_init is not None:
            return float(self.ssmax_s_init)
        return 0.0 if self.ssmax_form == "delta" else 1.0 / math.log(65.0)

    def to_dict(self) -> dict:
        return asdict(self)

    def init_from_differences(self, source: ModelConfig) -> list[str]:
        """The fields, as "name (source's there, this one's here)", in which a model of this config cannot
        start from `source`'s weights (`asentmax train --init-from`): every field but attention_backend,
        and when the normalisers differ, every field but NORMALISER_FIELDS too."""
        mine, theirs = asdict(self), asdict(source)
        ignored = ("attention_backend",) + (NORMALISER_FIELDS if self.attention != source.attention else ())
        return [f"{name} ({theirs[name]} there, {mine[name]} here)" for name in mine
                if name not in ignored and theirs[name] != mine[name]]

    @classmethod
    def from_dict(cls, values: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"ModelConfig.from_dict: unknown fields {unknown}")
        return cls(**values)
