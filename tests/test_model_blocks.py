"""The block designs of ModelConfig: Llama-style pre-norm (the default) and the Gemma-2 blocks of the paper's
code (arXiv:2506.16640, section 4 and its code; results/paper/README.md): sandwich RMSNorm, GeGLU,
sqrt(d_model) embedding scale, transformers' init, a frozen zero embedding.

The oracle is a fp64 forward written here from those definitions (it reads the model's weights by name and
calls none of its modules): logits and gradients must match it for every option. Also: KV-cache decoding
equals the full forward, torch.compile equals eager, the transformers export round-trips, config errors
are one line, and the committed runs' config.json files build the architecture each trained.
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asentmax.integrations.hf_model import load_hf, save_hf
from asentmax.nn import KVCache, ModelConfig, Transformer
from asentmax.nn.presets import PAPER_CODE_BLOCKS, mqmtar_model
from entmax_oracle import oracle_entmax

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 11
RESULTS = Path(__file__).resolve().parents[1] / "results"
# awkward shapes: head_dim 6, grouped-query attention (2 query heads per KV head), odd lengths
SHAPES = dict(vocab_size=VOCAB, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=40)
DESIGNS = {
    "llama": {},
    "paper_code": {**PAPER_CODE_BLOCKS, "zero_embedding_id": 3},
    "sandwich_only": {"norm_placement": "sandwich"},
    "geglu_only": {"mlp": "geglu"},
    "scaled_only": {"scale_embeddings": True},
}


def make_model(attention="asentmax", design="paper_code", seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(**{**SHAPES, "attention": attention, "position": "nape",
                            "attention_backend": "chunked", **DESIGNS[design], **overrides})
    model = Transformer(config).double()
    with torch.no_grad():  # non-trivial norms and temperatures (they start at 1 and 0)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif "temperature" in name:
                p.copy_(0.5 * torch.randn_like(p))
    return model


# ---- the oracle ----

def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def sparsemax(z):
    """alpha = 2 entmax along the last axis, by sorting (differentiable with autograd)."""
    zs, _ = z.sort(dim=-1, descending=True)
    ks = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    support = (1 + ks * zs > zs.cumsum(-1)).sum(-1, keepdim=True)
    tau = (zs.cumsum(-1).gather(-1, support - 1) - 1) / support
    return (z - tau).clamp_min(0)


def normalise(z, config):
    if config.attention == "softmax":
        return torch.softmax(z, -1)
    if config.alpha == 2:
        return sparsemax(z)
    p, _ = oracle_entmax(z.reshape(-1, z.shape[-1]), config.alpha)
    return p.reshape(z.shape)


def oracle_logits(params: dict, config: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """(B, T, V) fp64 logits from the definitions: NAPE (first H/2 heads ALiBi with slopes 1, 1/2, ..., the
    rest NoPE, where ASEntmax's theta = delta + softplus(W_b x + b) log(n+1)^(s tanh(W_g x + b)) scales
    the logits), causal attention, then the block design of `config`."""
    b, t = ids.shape
    heads, kv_heads, dim, eps = config.n_heads, config.kv_heads, config.head_dim, config.norm_eps
    half = heads // 2
    slopes = [1.0 / (k + 1) for k in range(half)] + [0.0] * half
    i = torch.arange(t, dtype=torch.float64)
    distance = i[None, :] - i[:, None]  # j - i
    causal = distance <= 0
    log_n = torch.log(i + 2)  # log(n_i + 1), n_i = i + 1 keys
    h = params["embed.weight"][ids]
    if config.zero_embedding_id is not None:  # that token's embedding is 0 and gets no gradient
        h = h * (ids != config.zero_embedding_id)[..., None]
    if config.scale_embeddings:
        h = h * math.sqrt(config.d_model)
    for layer in range(config.n_layers):
        w = {name[len(f"blocks.{layer}."):]: p for name, p in params.items()
             if name.startswith(f"blocks.{layer}.")}
        x = rms_norm(h, w["attn_norm.weight"], eps)
        q = (x @ w["attn.wq.weight"].T).view(b, t, heads, dim)
        k = (x @ w["attn.wk.weight"].T).view(b, t, kv_heads, dim)
        v = (x @ w["attn.wv.weight"].T).view(b, t, kv_heads, dim)
        heads_out = []
        for head in range(heads):
            kv = head // (heads // kv_heads)
            z = q[:, :, head] @ k[:, :, kv].transpose(1, 2) / math.sqrt(dim)  # (B, T, T)
            if config.attention == "asentmax" and head >= half:
                m, pre = head - half, "attn.temperature."
                beta = F.softplus(x @ w[pre + "beta_proj.weight"][m] + w[pre + "beta_proj.bias"][m])
                gamma = config.gamma_range * torch.tanh(x @ w[pre + "gamma_proj.weight"][m]
                                                        + w[pre + "gamma_proj.bias"][m])
                z = z * (config.theta_delta + beta * log_n ** gamma)[:, :, None]
            z = (z + slopes[head] * distance).masked_fill(~causal, -1e9)
            heads_out.append(normalise(z, config) @ v[:, :, kv])
        attended = torch.cat(heads_out, dim=-1) @ w["attn.wo.weight"].T
        if config.norm_placement == "sandwich":
            attended = rms_norm(attended, w["attn_post_norm.weight"], eps)
        h = h + attended
        x = rms_norm(h, w["mlp_norm.weight"], eps)
        up, gate = x @ w["mlp.w_up.weight"].T, x @ w["mlp.w_gate.weight"].T
        if config.mlp == "geglu":  # gelu, tanh approximation
            hidden = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3))) * up
        else:  # swiglu
            hidden = gate * torch.sigmoid(gate) * up
        transformed = hidden @ w["mlp.w_down.weight"].T
        if config.norm_placement == "sandwich":
            transformed = rms_norm(transformed, w["mlp_post_norm.weight"], eps)
        h = h + transformed
    head_weight = params["embed.weight"] if config.tie_embeddings else params["head.weight"]
    return rms_norm(h, params["norm.weight"], eps) @ head_weight.T


def ids_of(shape, seed=1):
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


# ---- tests ----

@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("attention", ["softmax", "asentmax"])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 13)], ids=str)
def test_forward_equals_the_oracle(design, attention, shape):
    model = make_model(attention, design)
    ids = ids_of(shape)
    params = dict(model.named_parameters())
    with torch.no_grad():
        want = oracle_logits(params, model.config, ids)
        torch.testing.assert_close(model(ids), want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("design", ["llama", "paper_code"])
@pytest.mark.parametrize("attention,alpha", [("softmax", 1.5), ("asentmax", 2.0)])
def test_gradients_equal_the_oracle(design, attention, alpha):
    """Every parameter's gradient of a random projection of the logits (alpha 2: the oracle's sparsemax
    is differentiable by autograd)."""
    model = make_model(attention, design, alpha=alpha)
    ids = ids_of((3, 9))
    probe = torch.randn(3, 9, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    params = dict(model.named_parameters())
    names = list(params)
    got = torch.autograd.grad((model(ids) * probe).sum(), [params[n] for n in names])
    want = torch.autograd.grad((oracle_logits(params, model.config, ids) * probe).sum(),
                               [params[n] for n in names])
    for name, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("attention", ["softmax", "entmax", "asentmax", "ssmax"])
def test_cached_decoding_equals_full_forward(attention):
    """Paper-code blocks: prefill 4 tokens, a 3-token chunk, then one at a time; a left-padded row too."""
    model = make_model(attention, "paper_code")
    ids = ids_of((2, 11))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache()
        steps = [model(ids[:, :4], cache=cache), model(ids[:, 4:7], cache=cache)]
        steps += [model(ids[:, t:t + 1], cache=cache) for t in range(7, 11)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
        padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids[1:, :8]], dim=1)
        mask = torch.tensor([[True] * 11, [False] * 3 + [True] * 8])
        cache = KVCache()
        prefill = model(torch.cat([ids[:1], padded]), attention_mask=mask, cache=cache)
        torch.testing.assert_close(prefill[1, 3:], full[1, :8], rtol=1e-10, atol=1e-12)
        step = model(torch.stack([ids[0, :1], ids[1, 8:9]]), cache=cache)
        torch.testing.assert_close(step[1, 0], full[1, 8], rtol=1e-10, atol=1e-12)


def test_generate_equals_greedy_full_forward():
    model = make_model("asentmax", "paper_code")
    prompt = ids_of((2, 5))
    out = model.generate(prompt, 6)
    with torch.no_grad():
        ids = prompt
        for _ in range(6):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_zero_embedding_stays_zero_through_training():
    model = make_model("asentmax", "paper_code")
    zero = model.config.zero_embedding_id
    assert not model.embed.weight[zero].any()
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.full((2, 8), zero)
    ids[:, ::3] = 1
    for _ in range(3):
        optimiser.zero_grad()
        model(ids).square().mean().backward()
        optimiser.step()
    assert not model.embed.weight[zero].any()
    assert model.embed.weight[1].any()


def test_initialisation():
    """init_std everywhere without the GPT-2 residual scaling; 1/sqrt(2 n_layers) of it with; ASEntmax's
    "normal" projections are normal(0, init_std) with zero biases."""
    def stds(**overrides):
        torch.manual_seed(0)
        model = Transformer(mqmtar_model(263, n_layers=8, **overrides))
        block = model.blocks[0]
        weights = {"wo": block.attn.wo.weight, "down": block.mlp.w_down.weight, "wq": block.attn.wq.weight}
        return {name: p.std().item() for name, p in weights.items()}, model
    scaled, _ = stds()
    flat, model = stds(**PAPER_CODE_BLOCKS)
    for name in ("wo", "down", "wq"):
        assert flat[name] == pytest.approx(0.02, rel=0.05)
    assert scaled["wq"] == pytest.approx(0.02, rel=0.05)
    for name in ("wo", "down"):
        assert scaled[name] == pytest.approx(0.02 / 4, rel=0.05)
    temperature = model.blocks[0].attn.temperature
    for proj in (temperature.beta_proj, temperature.gamma_proj):
        assert proj.weight.std().item() == pytest.approx(0.02, rel=0.1) and not proj.bias.any()
    for block in model.blocks:
        for norm in (block.attn_norm, block.attn_post_norm, block.mlp_norm, block.mlp_post_norm):
            assert torch.equal(norm.weight, torch.ones_like(norm.weight))


@pytest.mark.parametrize("overrides,message", [
    ({"norm_placement": "post"}, "unknown norm_placement 'post'"),
    ({"mlp": "reglu"}, "unknown mlp 'reglu'"),
    ({"scale_embeddings": "yes"}, "scale_embeddings must be true or false"),
    ({"scaled_residual_init": 0}, "scaled_residual_init must be true or false"),
    ({"zero_embedding_id": VOCAB, "tie_embeddings": False}, r"must be a token id in \[0, 11\), got 11"),
    ({"zero_embedding_id": -1, "tie_embeddings": False}, "zero_embedding_id must be a token id"),
    ({"zero_embedding_id": 2}, "zero_embedding_id needs tie_embeddings=False"),
])
def test_bad_config_is_one_line(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        ModelConfig(**{**SHAPES, **overrides})
    assert "\n" not in str(error.value)


def test_committed_runs_build_the_architecture_they_trained():
    """Every config.json under results/ loads with the parameter count the run recorded: those saved before
    the block options existed (most of them) with pre-norm SwiGLU blocks, no embedding scale, GPT-2 init and
    no frozen embedding; those saved with them (the paper-code-setup runs) with the options they name."""
    old_blocks = dict(norm_placement="pre", mlp="swiglu", scale_embeddings=False, scaled_residual_init=True,
                      zero_embedding_id=None)
    paths = sorted(RESULTS.rglob("config.json"))
    older = 0
    for path in paths:
        saved = json.loads(path.read_text())
        config = ModelConfig.from_dict(saved["model_config"])
        want = {name: saved["model_config"].get(name, value) for name, value in old_blocks.items()}
        older += all(name not in saved["model_config"] for name in old_blocks if name != "mlp")
        assert {name: getattr(config, name) for name in old_blocks} == want, path
        with torch.device("meta"):  # the shapes are what is checked: no memory, no initialisation
            model = Transformer(config)
        assert model.num_parameters() == saved["n_parameters"], path
        sandwich = config.norm_placement == "sandwich"
        post_norms = [norm is not None for block in model.blocks
                      for norm in (block.attn_post_norm, block.mlp_post_norm)]
        assert post_norms == [sandwich] * len(post_norms), path
    assert older > 0 and paths


def test_default_model_is_unchanged():
    """The default ModelConfig is the Llama-style design: the oracle with pre-norm and SwiGLU (above), and
    the same state-dict keys as before the options."""
    model = Transformer(ModelConfig(**SHAPES))
    assert model.embed_scale is None and model.embed.padding_idx is None
    assert {name.split(".", 2)[-1] for name in model.state_dict() if name.startswith("blocks.0.")} == {
        "attn_norm.weight", "attn.wq.weight", "attn.wk.weight", "attn.wv.weight", "attn.wo.weight",
        "attn.temperature.beta_proj.weight", "attn.temperature.beta_proj.bias",
        "attn.temperature.gamma_proj.weight", "attn.temperature.gamma_proj.bias",
        "mlp_norm.weight", "mlp.w_up.weight", "mlp.w_gate.weight", "mlp.w_down.weight"}


def test_transformers_export_round_trips(tmp_path):
    model = make_model("asentmax", "paper_code")
    save_hf(model, None, tmp_path / "hf")
    loaded = load_hf(tmp_path / "hf").double()
    assert loaded.config.model_config() == model.config
    ids = ids_of((2, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids))
    generated = loaded.generate(ids[:, :4], max_new_tokens=5, do_sample=False)
    assert torch.equal(generated, model.generate(ids[:, :4], 5))


def test_compiled_training_equals_eager():
    """torch.compile (fullgraph, aot_eager as in tests/test_compile.py) of the paper-code blocks."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SHAPES, position="nape", **PAPER_CODE_BLOCKS, zero_embedding_id=3,
                                    init_std=0.2))
    ids = ids_of((2, 9))

    def run(call):
        model.zero_grad()
        logits = call(ids)
        logits.square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    torch._dynamo.reset()
    eager_logits, eager_grads = run(model)
    logits, grads = run(torch.compile(model, fullgraph=True, backend="aot_eager"))
    torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-5)
    for name, want in eager_grads.items():
        torch.testing.assert_close(grads[name], want, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
