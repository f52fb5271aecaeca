"""Integrations with the Hugging Face ecosystem (the optional extra ``asentmax[hf]``).

  hf         attn_implementation="entmax" for any transformers decoder (AttentionInterface)
  hf_model   the package's Transformer as a transformers model (AsentmaxConfig, AsentmaxForCausalLM, save_hf)
  export     a training run's checkpoint.pt -> a transformers model directory
  tokenizer  a byte-level tokenizer built in code (no download)
  lm_eval    the lm-evaluation-harness model "asentmax" and its command line; lm_eval_tasks/ holds local tasks

Nothing here is imported by the core package, which never needs transformers.
"""
