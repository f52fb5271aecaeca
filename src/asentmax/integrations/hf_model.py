"""The package's decoder (asentmax.nn.Transformer, every normaliser and position scheme of arXiv:2506.16640,
section 2) as a transformers model: AsentmaxConfig / AsentmaxForCausalLM, model_type "asentmax".

    save_hf(model, model_config, "out/")                    # config.json + model.safetensors (+ tokenizer)
    hf_model = AutoModelForCausalLM.from_pretrained("out/")  # after asentmax.integrations.hf.register()
    hf_model.generate(ids, max_new_tokens=8)                 # the package's KV cache (asentmax.nn.KVCache)

AsentmaxConfig holds the ModelConfig fields under their own names (every one is written to config.json, so a
saved model does not change meaning when a ModelConfig default changes); `config.model_config()` rebuilds
the ModelConfig, which validates them. The weights are the Transformer's own state dict under "model.".
generate() uses transformers' GenerationMixin with the package's KVCache as `past_key_values`: prefill with
the prompt's attention mask, then one token per step; the mask of the new tokens is all real.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from asentmax.nn.cache import KVCache
from asentmax.nn.config import ModelConfig
from asentmax.nn.model import Transformer

MODEL_TYPE = "asentmax"
MODEL_FIELDS = tuple(f.name for f in fields(ModelConfig))
# transformers requires a config buildable without arguments (it diffs against it); 257 = bytes + <eos>
DEFAULT_VOCAB_SIZE = 257
IGNORE_INDEX = -100  # transformers' label convention


class AsentmaxConfig(PreTrainedConfig):
    model_type = MODEL_TYPE
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers",
                     "num_attention_heads": "n_heads", "intermediate_size": "d_ff",
                     "tie_word_embeddings": "tie_embeddings"}

    def __post_init__(self, **kwargs):
        values = {name: kwargs.pop(name) for name in MODEL_FIELDS if name in kwargs}
        values.setdefault("vocab_size", DEFAULT_VOCAB_SIZE)
        super().__post_init__(**kwargs, **ModelConfig(**values).to_dict())

    @classmethod
    def from_model_config(cls, model_config: ModelConfig, **kwargs) -> AsentmaxConfig:
        if not isinstance(model_config, ModelConfig):
            raise TypeError(f"expected a ModelConfig, got {type(model_config).__name__}")
        return cls(**model_config.to_dict(), **kwargs)

    def model_config(self) -> ModelConfig:
        return ModelConfig(**{name: getattr(self, name) for name in MODEL_FIELDS})

    def to_diff_dict(self) -> dict:
        return {**super().to_diff_dict(), **self.model_config().to_dict()}


class AsentmaxForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AsentmaxConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: AsentmaxConfig):
        super().__init__(config)
        # from_pretrained builds models under torch.device("meta"); the Transformer also holds derived
        # tensors that are not weights (the ALiBi slopes), so it is built for real, on the CPU, then loaded
        device = torch.get_default_device()
        with torch.device("cpu" if device.type == "meta" else device):
            self.model = Transformer(config.model_config())
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # past_key_values is the package's KVCache, created by forward

    def _init_weights(self, module):
        """Transformer initialises itself; from_pretrained then loads every tensor."""

    def get_input_embeddings(self):
        return self.model.embed

    def get_output_embeddings(self):
        return self.model.head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values: KVCache | None = None, labels: torch.Tensor | None = None,
                use_cache: bool | None = None, return_dict: bool | None = None, **kwargs):
        """logits (B, T, V) of `input_ids` (the new tokens when past_key_values holds a cache).

        attention_mask: (B, T) or, as transformers' generate() passes it, (B, cache + T); 1 = real token.
        labels: transformers' convention (shifted inside, -100 = no loss).
        use_cache: return the KVCache (a new one when past_key_values is None) as past_key_values."""
        if past_key_values is not None and not isinstance(past_key_values, KVCache):
            raise ValueError("past_key_values must be an asentmax KVCache, got "
                             f"{type(past_key_values).__name__}")
        cache = past_key_values
        if cache is None and use_cache:
            cache = KVCache()
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, -input_ids.shape[1]:].to(torch.bool)
            if cache is not None and cache.length > 0:
                if not bool(mask.all()):
                    raise ValueError("tokens appended to a KV cache must all be real (attention_mask 1)")
                mask = None  # the cache keeps the mask of its slots
        logits = self.model(input_ids, attention_mask=mask, cache=cache)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                   ignore_index=IGNORE_INDEX)
        if return_dict is False:
            return tuple(x for x in (loss, logits, cache) if x is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)


def register_auto_classes() -> None:
    """AutoConfig / AutoModelForCausalLM know model_type "asentmax" (idempotent)."""
    AutoConfig.register(MODEL_TYPE, AsentmaxConfig, exist_ok=True)
    AutoModelForCausalLM.register(AsentmaxConfig, AsentmaxForCausalLM, exist_ok=True)


def to_hf(model: Transformer, model_config: ModelConfig | None = None) -> AsentmaxForCausalLM:
    """An AsentmaxForCausalLM holding a copy of `model`'s weights (same dtype and device)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"expected an asentmax.nn.Transformer, got {type(model).__name__}")
    model_config = model.config if model_config is None else model_config
    if model_config != model.config:
        raise ValueError("model_config differs from the model's own config (model.config)")
    parameter = next(model.parameters())
    hf_model = AsentmaxForCausalLM(AsentmaxConfig.from_model_config(model_config))
    hf_model.to(device=parameter.device, dtype=parameter.dtype)
    hf_model.model.load_state_dict(model.state_dict())
    return hf_model


def save_hf(model: Transformer, model_config: ModelConfig | None, directory: Path | str,
            tokenizer=None, eos_token: str | None = None) -> Path:
    """Write `model` as a transformers model directory (config.json, model.safetensors) and, when given,
    the tokenizer: a transformers tokenizer, or a tokenizers.Tokenizer whose end-of-text token is
    `eos_token` (see asentmax.integrations.tokenizer.as_transformers_tokenizer). Returns the directory."""
    register_auto_classes()
    directory = Path(directory)
    to_hf(model, model_config).save_pretrained(directory)
    if tokenizer is not None:
        from asentmax.integrations.tokenizer import as_transformers_tokenizer

        as_transformers_tokenizer(tokenizer, eos_token).save_pretrained(directory)
    return directory


def load_hf(directory: Path | str, **kwargs) -> AsentmaxForCausalLM:
    """AsentmaxForCausalLM.from_pretrained(directory, **kwargs), local files only."""
    register_auto_classes()
    return AsentmaxForCausalLM.from_pretrained(directory, local_files_only=True, **kwargs)
