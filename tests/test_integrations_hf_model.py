"""The package's Transformer as a transformers model (asentmax.integrations.hf_model, export, tokenizer):
save_pretrained -> from_pretrained is bit-exact for every normaliser and position scheme; generate() with
the KV cache equals generate() without it and Transformer.generate; the loss follows transformers' label
convention; a training run's checkpoint exports to a loadable directory."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from asentmax.integrations import hf  # noqa: E402
from asentmax.integrations.export import export_run, main  # noqa: E402
from asentmax.integrations.hf_model import AsentmaxConfig, AsentmaxForCausalLM, load_hf, save_hf  # noqa: E402
from asentmax.integrations.tokenizer import BYTE_VOCAB_SIZE, EOS_TOKEN, byte_tokenizer  # noqa: E402
from asentmax.nn import ModelConfig, Transformer  # noqa: E402
from asentmax.nn.presets import lm_tiny  # noqa: E402
from asentmax.runs import CHECKPOINT_NAME, RunError, save_checkpoint  # noqa: E402
from conftest import randomize_temperatures  # noqa: E402

VOCAB = 37
CASES = [("softmax", "rope", True), ("ssmax", "alibi", False), ("topk", "nope", True),
         ("entmax", "nape", False), ("asentmax", "nape", True), ("asentmax", "rope", False)]


def random_model(attention="asentmax", position="nape", tie=False, seed=0) -> Transformer:
    torch.manual_seed(seed)
    config = lm_tiny(VOCAB, attention=attention, position=position, tie_embeddings=tie, topk_k=3,
                     init_std=0.3)
    model = Transformer(config).eval()
    randomize_temperatures(model)
    return model


@pytest.mark.parametrize("attention,position,tie", CASES)
def test_save_pretrained_round_trip_is_bit_exact(tmp_path, attention, position, tie):
    model = random_model(attention, position, tie)
    save_hf(model, model.config, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "asentmax" and saved["attention"] == attention
    hf.register()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, AsentmaxForCausalLM)
    assert loaded.config.model_config() == model.config
    ours, theirs = model.state_dict(), loaded.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    assert (loaded.model.head.weight is loaded.model.embed.weight) == tie
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids))


def test_every_model_config_field_is_saved(tmp_path):
    model = random_model()
    save_hf(model, None, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {key: saved[key] for key in model.config.to_dict()} == model.config.to_dict()


@pytest.mark.parametrize("attention,position", [("asentmax", "nape"), ("softmax", "rope")])
def test_generate_with_cache_equals_without_and_the_package_generate(attention, position):
    model = random_model(attention, position)
    hf_model = load_hf_from(model)
    ids = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :1] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with_cache = hf_model.generate(ids, use_cache=True, **kwargs)
    without = hf_model.generate(ids, use_cache=False, **kwargs)
    package = model.generate(ids, 6, attention_mask=mask.bool())
    assert with_cache.shape == (3, 13)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache, package)


def load_hf_from(model: Transformer) -> AsentmaxForCausalLM:
    hf_model = AsentmaxForCausalLM(AsentmaxConfig.from_model_config(model.config)).eval()
    hf_model.model.load_state_dict(model.state_dict())
    return hf_model


def test_loss_follows_the_transformers_label_convention():
    model = random_model()
    hf_model = load_hf_from(model)
    ids = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(3))
    labels = ids.clone()
    labels[0, :4] = -100
    loss = hf_model(ids, labels=labels).loss
    logits = model(ids).double()
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, ids[:, 1:, None])[..., 0]
    keep = labels[:, 1:] != -100
    torch.testing.assert_close(loss.double(), -logprobs[keep].mean(), atol=1e-5, rtol=1e-5)


def test_config_validates_and_mismatches_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown attention"):
        AsentmaxConfig(vocab_size=10, attention="bogus")
    model = random_model()
    other = ModelConfig(**{**model.config.to_dict(), "d_ff": 32})
    with pytest.raises(ValueError, match="differs"):
        save_hf(model, other, tmp_path)
    with pytest.raises(ValueError, match="KVCache"):
        load_hf_from(model)(torch.zeros(1, 2, dtype=torch.long), past_key_values=transformers.DynamicCache())


def test_export_run_checkpoint(tmp_path):
    model = random_model("entmax", "alibi")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_checkpoint(run_dir / CHECKPOINT_NAME, {"model_config": model.config.to_dict(),
                                                "model": model.state_dict(), "step": 5})
    out = export_run(run_dir, tmp_path / "hf")
    loaded = load_hf(out)
    ids = torch.randint(0, VOCAB, (1, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids))
    with pytest.raises(RunError, match="no checkpoint"):
        export_run(tmp_path / "missing", tmp_path / "hf2")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing"), str(tmp_path / "hf3")])


def test_byte_tokenizer_round_trips_bytes(tmp_path):
    tokenizer = byte_tokenizer()
    text = "key -> 1234567\n\tnaïve \x00 ü"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == BYTE_VOCAB_SIZE - 1 and len(tokenizer) == BYTE_VOCAB_SIZE
    tokenizer.save_pretrained(tmp_path)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode(text) == ids and again.eos_token_id == tokenizer.eos_token_id


def test_a_tokenizers_tokenizer_is_saved_with_its_eos_token(tmp_path):
    model = random_model()
    raw = byte_tokenizer().backend_tokenizer  # a plain tokenizers.Tokenizer
    with pytest.raises(ValueError, match="not in the tokenizer"):
        save_hf(model, None, tmp_path, tokenizer=raw, eos_token="<missing>")
    save_hf(model, None, tmp_path, tokenizer=raw, eos_token=EOS_TOKEN)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.eos_token == EOS_TOKEN and loaded.encode("ab") == [97, 98]
