"""The model's attention layer against an independent fp64 per-query loop (docs/method.md section 3):
z_j = theta_hi * (q_i . k_j) / sqrt(D) + m_h (pos_j - pos_i) over the real keys j <= i, with theta, the
ALiBi/NAPE slopes, RoPE (as a complex rotation) and every normaliser re-derived here from the formulas.
Also: theta against a hand computation, ASEntmax with beta = 0 equals entmax, and the statistics."""

import itertools
import math

import pytest
import torch

from asentmax.nn import ModelConfig, Transformer
from asentmax.nn.attention import AttentionContext

NORMALISERS = ("softmax", "ssmax", "topk", "entmax", "asentmax")
POSITIONS = ("nope", "alibi", "rope", "nape")


def entmax_bisect_fp64(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax of a 1-D fp64 vector by bisection on tau (independent of asentmax.ops)."""
    s = (alpha - 1) * z
    lo, hi = s.max() - 1.0, s.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        if (torch.clamp(s - mid, min=0) ** (1 / (alpha - 1))).sum() >= 1:
            lo = mid
        else:
            hi = mid
    p = torch.clamp(s - lo, min=0) ** (1 / (alpha - 1))
    return p / p.sum()


def expected_slopes(cfg: ModelConfig) -> list[float]:
    h = cfg.n_heads
    if cfg.position == "alibi":
        m = h
    elif cfg.position == "nape":
        m = h // 2
    else:
        return [0.0] * h
    if cfg.alibi_slopes == "harmonic":
        slopes = [1.0 / (i + 1) for i in range(m)]
    else:  # Press et al. for a power of two
        slopes = [2.0 ** (-8.0 * (i + 1) / m) for i in range(m)]
    return slopes + [0.0] * (h - m)


def rotate(x: torch.Tensor, pos: int, base: float) -> torch.Tensor:
    """RoPE as a complex rotation of the pairs (d, d + D/2) by pos * base^(-2d/D)."""
    half = x.shape[-1] // 2
    angle = pos * base ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    c = torch.complex(x[..., :half], x[..., half:]) * torch.exp(1j * angle)
    return torch.cat([c.real, c.imag], dim=-1)


def oracle_theta(attn, cfg: ModelConfig, x_i: torch.Tensor, n: int) -> list[float]:
    """theta of every head for one query with normed input x_i (d_model,) that sees n keys."""
    h = cfg.n_heads
    scaled = list(range(h // 2, h)) if cfg.position == "nape" else list(range(h))
    theta = [1.0] * h
    log_n = math.log(n + 1)
    for row, head in enumerate(scaled):
        if cfg.attention == "asentmax":
            t = attn.temperature
            beta_pre = float(t.beta_proj.weight[row] @ x_i + t.beta_proj.bias[row])
            gamma_pre = float(t.gamma_proj.weight[row] @ x_i + t.gamma_proj.bias[row])
            beta = math.log1p(math.exp(beta_pre))
            gamma = cfg.gamma_range * math.tanh(gamma_pre)
            theta[head] = cfg.theta_delta + beta * log_n**gamma
        elif cfg.attention == "ssmax":
            s = float(attn.temperature.s[row].detach())
            theta[head] = (cfg.theta_delta if cfg.ssmax_form == "delta" else 0.0) + s * log_n
    return theta


@torch.no_grad()
def oracle_layer(attn, cfg: ModelConfig, x: torch.Tensor, mask: torch.Tensor):
    """(output (B, T, d_model), probabilities {(b, h, i): p over the row's real keys <= i})."""
    b_size, t_size, _ = x.shape
    h, hkv, d = cfg.n_heads, cfg.kv_heads, cfg.head_dim
    q = (x @ attn.wq.weight.T).view(b_size, t_size, h, d)
    k = (x @ attn.wk.weight.T).view(b_size, t_size, hkv, d)
    v = (x @ attn.wv.weight.T).view(b_size, t_size, hkv, d)
    slopes = expected_slopes(cfg)
    heads_out = torch.zeros(b_size, t_size, h, d, dtype=torch.float64)
    probs = {}
    for b in range(b_size):
        real = [t for t in range(t_size) if mask[b, t]]
        for n_seen, i in enumerate(real, start=1):
            theta = oracle_theta(attn, cfg, x[b, i], n_seen)
            keys = real[:n_seen]
            for head in range(h):
                g = head // (h // hkv)
                qi, ks = q[b, i, head], k[b, keys, g]
                if cfg.position == "rope":
                    qi = rotate(qi, n_seen - 1, cfg.rope_base)
                    ks = torch.stack([rotate(ks[j], j, cfg.rope_base) for j in range(n_seen)])
                z = theta[head] * (ks @ qi) / math.sqrt(d)
                z = z + slopes[head] * (torch.arange(n_seen, dtype=torch.float64) - (n_seen - 1))
                if cfg.attention in ("softmax", "ssmax"):
                    p = torch.softmax(z, 0)
                elif cfg.attention == "topk":
                    keep = torch.zeros(n_seen, dtype=torch.bool)
                    keep[torch.argsort(z, descending=True)[: cfg.topk_k]] = True
                    p = torch.softmax(z.masked_fill(~keep, float("-inf")), 0)
                else:
                    p = entmax_bisect_fp64(z, cfg.alpha)
                probs[(b, head, i)] = p
                heads_out[b, i, head] = p @ v[b, keys, g]
    return heads_out.reshape(b_size, t_size, h * d) @ attn.wo.weight.T, probs


def tiny_config(attention, position, **overrides) -> ModelConfig:
    base = dict(vocab_size=13, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=32, topk_k=3,
                attention=attention, position=position, attention_backend="reference")
    return ModelConfig(**{**base, **overrides})


def randomise_temperature(model: Transformer, seed: int):
    """Non-trivial beta/gamma projections and SSMax scales (the zero init makes theta constant)."""
    gen = torch.Generator().manual_seed(seed)
    for block in model.blocks:
        t = block.attn.temperature
        if t is None:
            continue
        for name, p in t.named_parameters():
            p.data = 0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if name == "s":  # SSMax scales stay positive
                p.data.abs_()


def layer_inputs(cfg: ModelConfig, mask: torch.Tensor, seed: int):
    model = Transformer(cfg).double()
    randomise_temperature(model, seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*mask.shape, cfg.d_model, generator=gen, dtype=torch.float64)
    ids = torch.zeros(mask.shape, dtype=torch.long)
    ctx = model._context(ids, mask if not bool(mask.all()) else None, None)
    return model, x, ctx


# Row 0 unpadded, row 1 left-padded by 3, row 2 right-padded by 2 (no cache: right padding is allowed).
MASK = torch.tensor([[True] * 7, [False] * 3 + [True] * 4, [True] * 5 + [False] * 2])


@pytest.mark.parametrize("attention,position", list(itertools.product(NORMALISERS, POSITIONS)),
                         ids=lambda v: str(v))
def test_layer_matches_fp64_oracle(attention, position):
    cfg = tiny_config(attention, position)
    model, x, ctx = layer_inputs(cfg, MASK, seed=1)
    attn = model.blocks[0].attn
    out, stats = attn(x, ctx, want_stats=True)
    expected, probs = oracle_layer(attn, cfg, x, MASK)
    real = MASK[:, :, None].expand_as(out)
    torch.testing.assert_close(out[real], expected[real], rtol=1e-9, atol=1e-11)
    for (b, h, i), p in probs.items():
        entropy = -(p[p > 0] * p[p > 0].log()).sum()
        assert int(stats.support_size[b, h, i]) == int((p > 0).sum())
        torch.testing.assert_close(stats.entropy[b, h, i], entropy, rtol=1e-7, atol=1e-9)
        if p.numel() > 1:
            torch.testing.assert_close(stats.normalised_entropy[b, h, i], entropy / math.log(p.numel()),
                                       rtol=1e-7, atol=1e-9)
    assert stats.support_size[~MASK[:, None, :].expand_as(stats.support_size)].eq(-1).all()


def test_geometric_slopes_and_gqa_layer():
    cfg = tiny_config("entmax", "alibi", alibi_slopes="geometric", n_kv_heads=1, alpha=1.7)
    model, x, ctx = layer_inputs(cfg, MASK, seed=2)
    attn = model.blocks[0].attn
    out, _ = attn(x, ctx)
    expected, _ = oracle_layer(attn, cfg, x, MASK)
    real = MASK[:, :, None].expand_as(out)
    torch.testing.assert_close(out[real], expected[real], rtol=1e-9, atol=1e-11)


def test_theta_hand_computation():
    """d_model = 2, two NoPE heads: theta = 1 + softplus(w.x + b) * log(n + 1) ^ (2 tanh(u.x + c))."""
    cfg = ModelConfig(vocab_size=5, d_model=2, n_layers=1, n_heads=2, d_ff=4, attention="asentmax",
                      position="nope")
    t = Transformer(cfg).double().blocks[0].attn.temperature
    with torch.no_grad():
        t.beta_proj.weight.copy_(torch.tensor([[0.5, -1.0], [0.0, 2.0]], dtype=torch.float64))
        t.beta_proj.bias.copy_(torch.tensor([0.1, -0.3], dtype=torch.float64))
        t.gamma_proj.weight.copy_(torch.tensor([[1.0, 0.0], [-0.4, 0.3]], dtype=torch.float64))
        t.gamma_proj.bias.copy_(torch.tensor([0.0, 0.2], dtype=torch.float64))
    x = torch.tensor([[[1.0, 2.0], [-0.5, 0.25]]], dtype=torch.float64)
    n_keys = torch.tensor([[1, 37]])
    theta = t(x, n_keys).detach()
    softplus = lambda a: math.log(1 + math.exp(a))
    # query 0 (x = (1, 2), n = 1), head 0: beta = softplus(0.5 - 2 + 0.1), gamma = 2 tanh(1)
    h00 = 1 + softplus(-1.4) * math.log(2) ** (2 * math.tanh(1.0))
    # query 1 (x = (-0.5, 0.25), n = 37), head 1: beta = softplus(0.5 - 0.3), gamma = 2 tanh(0.475)
    h11 = 1 + softplus(0.2) * math.log(38) ** (2 * math.tanh(0.475))
    assert theta.shape == (1, 2, 2)
    assert abs(float(theta[0, 0, 0]) - h00) < 1e-12
    assert abs(float(theta[0, 1, 1]) - h11) < 1e-12


def test_ssmax_theta_forms():
    for form, delta in (("delta", 1.0), ("plain", 0.0)):
        cfg = tiny_config("ssmax", "nape", ssmax_form=form, ssmax_s_init=0.3)
        t = Transformer(cfg).double().blocks[0].attn.temperature
        n_keys = torch.tensor([[1, 2, 100]])
        theta = t(torch.zeros(1, 3, cfg.d_model, dtype=torch.float64), n_keys)
        expected = [delta + 0.3 * math.log(n + 1) for n in (1, 2, 100)]
        torch.testing.assert_close(theta[0, 2:], torch.tensor([expected] * 2, dtype=torch.float64))
        assert theta[0, :2].eq(1.0).all()  # ALiBi heads are never scaled under NAPE


@pytest.mark.parametrize("position", ["nope", "nape"])
def test_asentmax_with_zero_beta_is_entmax(position):
    cfg = tiny_config("asentmax", position, n_layers=2)
    torch.manual_seed(3)
    model = Transformer(cfg).double()
    randomise_temperature(model, 3)
    plain = Transformer(tiny_config("entmax", position, n_layers=2)).double()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "temperature" not in k})
    with torch.no_grad():
        for block in model.blocks:
            block.attn.temperature.beta_proj.bias.fill_(-1e4)  # softplus(-1e4) == 0 exactly in fp64
    ids = torch.randint(0, 13, (2, 11))
    torch.testing.assert_close(model(ids), plain(ids), rtol=0, atol=1e-13)


def test_nape_head_split_in_context():
    cfg = tiny_config("asentmax", "nape", n_heads=8, n_kv_heads=None)
    model = Transformer(cfg)
    ctx: AttentionContext = model._context(torch.zeros(1, 4, dtype=torch.long), None, None)
    assert ctx.slopes.tolist() == [1.0, 0.5, 1 / 3, 0.25, 0.0, 0.0, 0.0, 0.0]
    assert model.blocks[0].attn.temperature.beta_proj.out_features == 4  # NoPE heads only
    theta = model.blocks[0].attn.temperature(torch.randn(1, 4, 32), ctx.n_keys)
    assert theta[:, :4].eq(1.0).all() and theta[:, 4:].gt(1.0).all()
    assert ctx.n_keys.tolist() == [[1, 2, 3, 4]]


def test_kernel_slopes_made_once_per_dtype():
    """The (B, H) slopes handed to entmax_attention: ctx.slopes per batch row in the asked dtype, one tensor
    per dtype shared by every layer of the call, none without ALiBi."""
    model = Transformer(tiny_config("asentmax", "nape", n_heads=8, n_kv_heads=None))
    ctx: AttentionContext = model._context(torch.zeros(3, 4, dtype=torch.long), None, None)
    fp32 = ctx.kernel_slopes(torch.float32)
    assert fp32.dtype == torch.float32 and fp32.shape == (3, 8) and fp32.is_contiguous()
    torch.testing.assert_close(fp32, ctx.slopes.float().expand(3, 8), rtol=0, atol=0)
    assert ctx.kernel_slopes(torch.float32) is fp32
    fp64 = ctx.kernel_slopes(torch.float64)
    assert fp64.dtype == torch.float64 and torch.equal(fp64[1], ctx.slopes)
    rope = Transformer(tiny_config("entmax", "rope"))
    assert rope._context(torch.zeros(1, 4, dtype=torch.long), None, None).kernel_slopes(torch.float32) is None


@pytest.mark.parametrize("attention", ["asentmax", "ssmax"])
def test_shared_log_n_keys_gives_the_modules_theta(attention):
    """The log(n_i + 1) that AttentionContext computes once per call for every layer gives each temperature
    module exactly the theta it computes from n_keys by itself."""
    model = Transformer(tiny_config(attention, "nope", n_layers=2))
    randomise_temperature(model, 5)
    ids = torch.zeros(2, 6, dtype=torch.long)
    mask = torch.tensor([[False, True, True, True, True, True]] * 2)
    ctx: AttentionContext = model._context(ids, mask, None)
    log_n = ctx.log_n_keys(torch.float32)
    assert ctx.log_n_keys(torch.float32) is log_n and log_n.shape == (2, 1, 6)
    x = torch.randn(2, 6, 32)
    for block in model.blocks:
        temperature = block.attn.temperature
        assert torch.equal(temperature(x, ctx.n_keys, log_n), temperature(x, ctx.n_keys))
