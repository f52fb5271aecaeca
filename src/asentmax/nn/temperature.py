"""Per-query inverse temperatures theta_hi of ASEntmax and SSMax (arXiv:2506.16640, section 2).

ASEntmax: theta_hi = delta + beta_hi * log(n_i + 1) ^ gamma_hi,
          beta_hi = softplus(w_beta_h . x_i + b_beta_h),  gamma_hi = s * tanh(w_gamma_h . x_i + b_gamma_h),
          x_i the block's normed input, n_i the number of keys query i sees, s the gamma range.
SSMax:    theta_hi = s_h * log(n_i + 1)  ("plain") or delta + s_h * log(n_i + 1)  ("delta"), s_h learned.
Only the scaled heads get a temperature (the last H/2 under NAPE); the other heads get theta = 1.
The ASEntmax projections' weights start as ModelConfig.asentmax_init says and their biases so that beta and
gamma start at asentmax_beta_init (default log 2) and asentmax_gamma_init (default 0) where w . x = 0.
Theta is computed in fp32 (fp64 when the input is fp64) and returned as (B, H, T): the `q_scale` of
asentmax.ops.attention.entmax_attention (that name from here down to the kernels). Which normaliser gets
which module: the `temperature` field of nn/normalisers.py, keys of TEMPERATURES.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from asentmax.nn.config import ModelConfig
from asentmax.nn.normalisers import get_normaliser
from asentmax.nn.positions import scaled_head_count
from asentmax.ops.entmax import compute_dtype


def log_key_counts(n_keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """n_keys (B|1, T) -> log(n_i + 1) as (B|1, 1, T) in `dtype`, >= log 2 > 0: the factor of both modules.
    AttentionContext.log_n_keys computes it once per forward call and hands it to every layer (one row
    when no key is padded)."""
    return torch.log(n_keys.to(dtype) + 1.0)[:, None, :]


def _with_unscaled_heads(theta_scaled: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, m, T) temperatures of the last m heads -> (B, H, T) with theta = 1 on the first H - m heads."""
    b, m, t = theta_scaled.shape
    if m == n_heads:
        return theta_scaled
    ones = theta_scaled.new_ones(b, n_heads - m, t)
    return torch.cat([ones, theta_scaled], dim=1)


class ASEntmaxTemperature(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.delta = config.theta_delta
        self.gamma_range = config.gamma_range
        m = scaled_head_count(config)
        self.beta_proj = nn.Linear(config.d_model, m, bias=True)
        self.gamma_proj = nn.Linear(config.d_model, m, bias=True)
        self.init = config.asentmax_init
        self.init_std = config.init_std
        # the biases that give beta = asentmax_beta_init and gamma = asentmax_gamma_init where w . x = 0
        beta_init = config.asentmax_beta_init
        self.beta_bias = 0.0 if beta_init is None else math.log(math.expm1(beta_init))
        self.gamma_bias = math.atanh(config.asentmax_gamma_init / config.gamma_range)

    def reset_parameters(self):
        for proj, bias in ((self.beta_proj, self.beta_bias), (self.gamma_proj, self.gamma_bias)):
            if self.init == "zero":
                nn.init.zeros_(proj.weight)
            elif self.init == "normal":
                nn.init.normal_(proj.weight, std=self.init_std)
            else:
                proj.reset_parameters()
            nn.init.constant_(proj.bias, bias)

    def beta_gamma(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, d_model) -> beta, gamma of the scaled heads, each (B, m, T)."""
        dtype = compute_dtype(x.dtype)
        beta_logit, gamma_logit = self.beta_proj(x).to(dtype), self.gamma_proj(x).to(dtype)  # (B, T, m)
        if torch.compiler.is_compiling():
            # (B, m, T) contiguous before the nonlinearities: a compiled softplus backward fed a transposed
            # gradient returned other strides than its meta kernel said. Eager keeps the (B, T, m) layout,
            # whose backward rounds as every earlier release did (the same trained models)
            return (F.softplus(beta_logit.transpose(1, 2).contiguous()),
                    self.gamma_range * torch.tanh(gamma_logit.transpose(1, 2).contiguous()))
        beta, gamma = F.softplus(beta_logit), self.gamma_range * torch.tanh(gamma_logit)
        return beta.transpose(1, 2), gamma.transpose(1, 2)

    def forward(self, x: torch.Tensor, n_keys: torch.Tensor,
                log_n: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) normed block input, n_keys (B, T) keys visible per query -> theta (B, H, T).
        log_n: log_key_counts(n_keys, compute_dtype(x.dtype)) when the caller already has it."""
        beta, gamma = self.beta_gamma(x)
        if log_n is None:
            log_n = log_key_counts(n_keys, beta.dtype)
        theta = self.delta + beta * log_n.pow(gamma)
        return _with_unscaled_heads(theta, self.n_heads)


class SSMaxTemperature(nn.Module):
    """theta_hi = delta + s_h log(n_i + 1) (arXiv:2506.16640, section 2; docs/method.md section 4).

    With one row of log(n_i + 1) for the batch (AttentionContext.log_n_keys when no key is padded, as in
    training), theta is built as (1, H, T) and expanded to (B, H, T). Through SDPA, torch.compile's gradient
    of s was wrong on the H200 in this form as in the (B, 1, T) one; through the fused kernel, which SSMax
    attention uses (nn/normalisers.py), it is right (results/gpu_tests_session8.md)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.delta = config.theta_delta if config.ssmax_form == "delta" else 0.0
        self.initial_s = config.ssmax_initial_s
        self.s = nn.Parameter(torch.empty(scaled_head_count(config)))

    def reset_parameters(self):
        nn.init.constant_(self.s, self.initial_s)

    def forward(self, x: torch.Tensor, n_keys: torch.Tensor,
                log_n: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d_model) (only its dtype is used), n_keys (B, T), log_n as ASEntmaxTemperature's ->
        theta (B, H, T)."""
        dtype = compute_dtype(x.dtype)
        if log_n is None:
            log_n = log_key_counts(n_keys, dtype)
        theta = self.delta + self.s.to(dtype)[None, :, None] * log_n  # (B|1, m, T)
        return _with_unscaled_heads(theta, self.n_heads).expand(n_keys.shape[0], -1, -1)


TEMPERATURES = {"asentmax": ASEntmaxTemperature, "ssmax": SSMaxTemperature}


def make_temperature(config: ModelConfig) -> nn.Module | None:
    """The inverse-temperature module of config.attention's normaliser, or None when it has none."""
    kind = get_normaliser(config.attention).temperature
    return None if kind is None else TEMPERATURES[kind](config)
