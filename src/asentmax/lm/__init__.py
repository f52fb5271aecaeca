"""Workload 2: language modelling at one-GPU scale (arXiv:2506.16640, section 5).

corpus.py (pinned Debian packages -> documents), tokenizer.py (byte-level BPE), dataset.py (splits, token
files, windows inside one document), workload.py (the trainer's Workload), needles.py (S-NIAH-1/2 and
passkey prompts), evaluate.py (perplexity, retrieval, dispersion at 1x-16x), report.py (tables, plots),
cli.py (`asentmax lm prepare | train | eval | compare`; the only module here that uses the trainer).
"""
