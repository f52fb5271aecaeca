"""Export a training run (run directory with checkpoint.pt, asentmax.runs) to a transformers model directory.

    python -m asentmax.integrations.export runs/mqmtar out/mqmtar-hf [--tokenizer bytes]

The checkpoint is read with asentmax.runs.load_checkpoint (weights_only=True); its "model_config" and
"model" entries rebuild the Transformer, which save_hf writes as config.json + model.safetensors.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from asentmax.integrations.hf_model import save_hf
from asentmax.nn.config import ModelConfig
from asentmax.nn.model import Transformer
from asentmax.runs import CHECKPOINT_NAME, RunError, load_checkpoint


def load_run_model(run_dir: Path | str) -> Transformer:
    """The Transformer saved in run_dir/checkpoint.pt (CPU, fp32 as trained)."""
    path = Path(run_dir) / CHECKPOINT_NAME
    state = load_checkpoint(path)
    if "model_config" not in state:
        raise RunError(f"{path} has no model_config; it is not a model training checkpoint")
    model = Transformer(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(state["model"])
    return model.eval()


def export_run(run_dir: Path | str, out_dir: Path | str, tokenizer=None) -> Path:
    """Write the run's model to out_dir as a transformers model (and the tokenizer, when given)."""
    model = load_run_model(run_dir)
    return save_hf(model, model.config, out_dir, tokenizer=tokenizer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m asentmax.integrations.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="run directory holding checkpoint.pt")
    parser.add_argument("out_dir", help="transformers model directory to write")
    parser.add_argument("--tokenizer", choices=("none", "bytes"), default="none",
                        help="also save a tokenizer: bytes = asentmax.integrations.tokenizer.byte_tokenizer")
    args = parser.parse_args(argv)
    tokenizer = None
    if args.tokenizer == "bytes":
        from asentmax.integrations.tokenizer import byte_tokenizer
        tokenizer = byte_tokenizer()
    try:
        out = export_run(args.run_dir, args.out_dir, tokenizer=tokenizer)
    except RunError as error:
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
