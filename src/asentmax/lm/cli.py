"""`asentmax lm prepare | train | eval | compare`: the drivers of the language-modelling workload
(arXiv:2506.16640, section 5). This module sits above the trainer: it builds the LMWorkload and the
configs, hands them to asentmax.trainer (new runs) or asentmax.train.resume_run, and writes evaluations.

asentmax.cli registers the subcommands with `add_lm_parser(sub, add_config_flags, usage_error)` (the
shared flag builder and one-line error type are passed in, so that nothing here imports the CLI back).

Run directory additions: lm_eval.json (the results with the step, escape step, workload, training and
model config they come from), lm_eval.md, perplexity.png, retrieval.png. A run whose training stopped before
its planned end is evaluated with a warning and compared as "cut at S of N steps" (runs.training_cut).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import fields
from pathlib import Path

# optimisation defaults of an LM run: 2500 steps of 256 windows of 512 tokens = 328M token slots (~309M
# scored targets, ~11 epochs of the prepared corpus) on one H200
LM_TRAIN_DEFAULTS = dict(steps=2500, batch_size=256, lr=2e-3, warmup_steps=200, weight_decay=0.1, beta2=0.95,
                         val_every=500, log_every=50, checkpoint_every=800)
EVAL_NAME = "lm_eval"


def add_lm_parser(sub, add_config_flags, usage_error) -> None:
    from asentmax.lm.needles import TASKS
    from asentmax.lm.workload import ATTENTION_PRESETS, MODEL_SIZES, LMConfig
    from asentmax.nn.generation import CUDA_GRAPH_SETTINGS

    lm = sub.add_parser("lm", help="language modelling: prepare the corpus, train, evaluate, compare")
    lm_sub = lm.add_subparsers(dest="lm_command", required=True, parser_class=type(lm))

    p = lm_sub.add_parser("prepare", help="build the corpus, train the tokenizer, write the token splits")
    p.add_argument("--out", type=Path, default=Path("data/lm"), help="output folder (default data/lm)")
    p.add_argument("--cache", type=Path, default=Path("data/lm-packages"),
                   help="where the pinned .deb packages are downloaded and unpacked "
                   "(default data/lm-packages)")
    p.add_argument("--text-folder", type=Path,
                   help="use the .txt files of this folder as the documents instead of the Debian packages")
    p.add_argument("--vocab-size", type=int, default=16384, help="BPE vocabulary size (default 16384)")
    p.add_argument("--context", type=int, default=512, help="training context; held-out documents have "
                   ">= 16x this many tokens (default 512)")
    p.add_argument("--test-docs", type=int, default=64, help="held-out long documents (default 64)")
    p.add_argument("--valid-docs", type=int, default=64, help="validation documents (default 64)")
    p.set_defaults(run=lambda args: _guard(usage_error, _prepare, args))

    from asentmax.nn import ModelConfig
    from asentmax.nn.config import CHOICES
    from asentmax.nn.presets import PAPER_CODE_BLOCKS
    from asentmax.trainer import TrainConfig

    lm_defaults = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in LM_TRAIN_DEFAULTS.items())
    p = lm_sub.add_parser("train", help="train an LM on the prepared data (TrainConfig, LMConfig flags)",
                          description=f"Train an LM. Optimisation defaults of LM runs: {lm_defaults}; "
                          "the other TrainConfig flags keep TrainConfig's defaults (torch.compile and "
                          "fused AdamW are on by default on CUDA). The block options (the ModelConfig "
                          "flags of `asentmax train`; asentmax.nn.presets.PAPER_CODE_BLOCKS, the Gemma-2 "
                          "blocks of the paper's code, lists them) keep the --size preset's values unless "
                          "given.")
    p.add_argument("--run-dir", required=True, type=Path, help="output directory (refused if it exists)")
    p.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    train_names = add_config_flags(p, TrainConfig, defaults_note="default: TrainConfig's or the LM one above")
    lm_names = add_config_flags(p, LMConfig, skip=tuple(train_names),
                                choices={"preset": tuple(ATTENTION_PRESETS), "size": tuple(MODEL_SIZES)})
    block_names = add_config_flags(p, ModelConfig, skip=[f.name for f in fields(ModelConfig)
                                                         if f.name not in PAPER_CODE_BLOCKS],
                                   choices=CHOICES, defaults=_size_defaults(PAPER_CODE_BLOCKS))
    p.set_defaults(run=lambda args: _guard(usage_error, _train, args, train_names, lm_names, block_names))

    p = lm_sub.add_parser("eval", help="perplexity, needle retrieval and dispersion at 1x..16x the context")
    p.add_argument("run_dirs", nargs="+", type=Path, help="trained LM run directories")
    p.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                   help="lengths as multiples of the training context (default 1 2 4 8 16)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS,
                   help="needle tasks (default: " + " ".join(TASKS) + ")")
    p.add_argument("--samples", type=int, default=100, help="needle prompts per task and length "
                   "(default 100)")
    p.add_argument("--batch-size", type=int, default=16, help="needle prompts per generate call (default 16)")
    p.add_argument("--tokens-per-batch", type=int, default=32768, help="perplexity batch size in tokens")
    p.add_argument("--stats-max-length", type=int, default=2048,
                   help="longest length for the (dense) dispersion statistics (default 2048)")
    p.add_argument("--stats-windows", type=int, default=4, help="windows per length for the statistics")
    p.add_argument("--data", type=Path, help="prepared data folder (default: the run's)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--seed", type=int, default=0, help="seed of the needle prompts")
    p.add_argument("--cuda-graphs", default="auto", choices=CUDA_GRAPH_SETTINGS,
                   help="the needle completions decode with a static KV cache whose steps replay a CUDA "
                        "graph: auto (default: on CUDA where the model allows it, not top-k attention) | on "
                        "| off")
    p.set_defaults(run=lambda args: _guard(usage_error, _eval, args))

    p = lm_sub.add_parser("compare", help="evaluated LM runs into one markdown file and plots")
    p.add_argument("run_dirs", nargs="+", type=Path, help="evaluated LM run directories")
    p.add_argument("--out", type=Path, default=Path("results/lm"), help="output folder (default results/lm)")
    p.set_defaults(run=lambda args: _guard(usage_error, _compare, args))


def _size_defaults(names) -> dict:
    """The default of each ModelConfig field in `names` for the help: its value under every --size, or
    each size's where they differ (e.g. "lm_tiny False, lm_25m True, lm_120m False")."""
    from asentmax.lm.workload import MODEL_SIZES

    configs = {size: make(1) for size, make in MODEL_SIZES.items()}
    shown = {}
    for name in names:
        values = {size: getattr(config, name) for size, config in configs.items()}
        shown[name] = (next(iter(values.values())) if len(set(values.values())) == 1
                       else ", ".join(f"{size} {value}" for size, value in values.items()))
    return shown


def _guard(usage_error, function, *args):
    """User mistakes (bad values, missing files or runs) become the CLI's one-line error."""
    from asentmax.runs import RunError

    try:
        function(*args)
    except (ValueError, FileNotFoundError, RunError) as error:
        raise usage_error(str(error)) from None


# ---- prepare ----

def _prepare(args) -> None:
    from asentmax.lm.corpus import SOURCES, deduplicate, fetch_sources, read_documents, read_text_folder
    from asentmax.lm.dataset import prepare

    start = time.perf_counter()
    if args.text_folder is not None:
        documents = read_text_folder(args.text_folder)
        sources = [{"folder": str(args.text_folder), "documents": len(documents)}]
    else:
        documents = read_documents(fetch_sources(args.cache))
        sources = [{"package": s.package, "version": s.version, "sha256": s.sha256, "root": s.root,
                    "patterns": list(s.patterns), "exclude": list(s.exclude), "held_out_ok": s.held_out_ok,
                    "documents": sum(d.source == s.package for d in documents)} for s in SOURCES]
    kept = deduplicate(documents)
    print(f"{len(documents)} documents, {len(kept)} after dropping duplicates and short ones")
    manifest = prepare(kept, args.out, vocab_size=args.vocab_size, context=args.context,
                       n_test=args.test_docs, n_valid=args.valid_docs, sources=sources)
    manifest["documents_read"], manifest["documents_kept"] = len(documents), len(kept)
    manifest["command"] = " ".join(["asentmax"] + sys.argv[1:])
    manifest["prepare_s"] = round(time.perf_counter() - start, 1)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name, split in manifest["splits"].items():
        print(f"{name}: {split['documents']} documents, {split['tokens']} tokens")


# ---- train ----

def _train(args, train_names, lm_names, block_names) -> None:
    from asentmax.lm.workload import LMConfig, LMWorkload
    from asentmax.runs import training_stop
    from asentmax.trainer import TrainConfig, train

    names = train_names + lm_names + block_names
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    if args.resume:
        flags = ["--" + name.replace("_", "-") for name in given if name != "steps"]
        if flags:
            raise ValueError(f"--resume continues with the saved configuration; drop {' '.join(flags)} "
                             "(only --steps may be given, to extend the run)")
        from asentmax.train import load_run, resume_run  # rebuilds the workload via asentmax.train.WORKLOADS

        saved = load_run(args.run_dir)
        if saved.checkpoint["workload"].get("name") != "lm":
            raise ValueError(f"{args.run_dir} is not an LM run; resume it with `asentmax train --resume`")
        summary = resume_run(args.run_dir, saved, steps=given.get("steps"), progress=not args.no_progress)
        workload, batch_size = saved.workload, saved.train_config.batch_size
    else:
        if args.run_dir.exists():
            raise ValueError(f"{args.run_dir} exists; pick a new --run-dir or pass --resume")
        workload = LMWorkload(LMConfig(**{k: v for k, v in given.items() if k in lm_names}))
        train_values = {k: v for k, v in given.items() if k in train_names}
        train_config = TrainConfig(**{**LM_TRAIN_DEFAULTS, **train_values})
        model_config = workload.model_config({k: v for k, v in given.items() if k in block_names})
        summary = train(workload, train_config, model_config, args.run_dir, progress=not args.no_progress)
        batch_size = train_config.batch_size
    summary.update(epoch_report(workload, summary["step"], batch_size))
    report = args.run_dir / "lm_train.json"
    if args.resume and report.is_file():  # the wall time of a resumed run adds up over its parts
        summary["elapsed_s"] += json.loads(report.read_text()).get("elapsed_s", 0.0)
    report.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "val"}, default=str))
    stop = training_stop(summary, args.run_dir, f"asentmax lm train --run-dir {args.run_dir} --resume")
    if stop is not None:  # stalled (exit 3) or interrupted (130), as `asentmax train`
        print(stop[1], file=sys.stderr)
        raise SystemExit(stop[0])


def epoch_report(workload, steps: int, batch_size: int) -> dict:
    """Tokens a run of `steps` steps saw (window slots and scored targets) and its epochs over the training
    split (the windows of every training document, once each, make one epoch)."""
    windows = steps * batch_size
    per_window = workload.targets_per_epoch / len(workload.train_windows)
    return {"windows_seen": windows, "token_slots_seen": windows * workload.config.context,
            "targets_seen": round(windows * per_window), "train_windows": len(workload.train_windows),
            "train_targets_per_epoch": workload.targets_per_epoch,
            "epochs": windows / len(workload.train_windows)}


# ---- eval ----

def _load_model(run_dir: Path, device):
    from asentmax.nn import ModelConfig, Transformer
    from asentmax.runs import CHECKPOINT_NAME, load_checkpoint

    checkpoint = load_checkpoint(run_dir / CHECKPOINT_NAME, map_location="cpu")
    workload = checkpoint.get("workload") or {}
    if workload.get("name") != "lm":
        raise ValueError(f"{run_dir} is not an LM run (workload {workload.get('name')!r})")
    model = Transformer(ModelConfig.from_dict(checkpoint["model_config"]))
    model.load_state_dict(checkpoint["model"])
    trained = {"train_step": checkpoint["step"], "train_config": checkpoint["train_config"],
               "escape_step": checkpoint.get("escape_step")}
    return model.to(device).eval(), workload, trained


def _eval(args) -> None:
    import numpy as np
    import torch

    from asentmax import precision
    from asentmax.lm.dataset import Split, read_manifest
    from asentmax.lm.evaluate import evaluate_model
    from asentmax.lm.report import markdown, plot
    from asentmax.lm.tokenizer import LMTokenizer
    from asentmax.nn.generation import decodes_with_cuda_graph
    from asentmax.runs import describe_device, git_commit, training_cut, write_json, write_text

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    for run_dir in args.run_dirs:
        start = time.perf_counter()
        model, workload, trained = _load_model(run_dir, device)
        cuda_graph = decodes_with_cuda_graph(args.cuda_graphs, model.config, device.type)  # before the data
        cut = training_cut(trained)
        if cut:
            print(f"warning: {run_dir} stopped training at step {cut[0]} of {cut[1]} (cut short); its "
                  "results are those of a partly trained model", file=sys.stderr)
        data = args.data or Path(workload["data"])
        read_manifest(data)
        tokenizer = LMTokenizer.load(data)
        test = Split.load(data / "test.npz")
        documents = [np.asarray(test.document(d)) for d in range(test.n_documents)]
        result = evaluate_model(model, tokenizer, documents, context=int(workload["context"]),
                                multipliers=sorted(args.multipliers), retrieval_samples=args.samples,
                                retrieval_batch_size=args.batch_size, tokens_per_batch=args.tokens_per_batch,
                                stats_max_length=args.stats_max_length, stats_windows=args.stats_windows,
                                seed=args.seed, tasks=tuple(args.tasks),
                                autocast_dtype=precision.autocast_dtype("auto", device),
                                cuda_graph=cuda_graph)
        elapsed = round(time.perf_counter() - start, 1)
        result.update({"run_dir": str(run_dir), **trained, "workload": workload,
                       "model_config": model.config.to_dict(),
                       "n_parameters": model.num_parameters(), "eval_s": elapsed,
                       "device": describe_device(device), "git_commit": git_commit(),
                       "python": platform.python_version(), "command": " ".join(["asentmax"] + sys.argv[1:]),
                       "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                    if k not in ("run", "run_dirs")}})
        write_json(run_dir / f"{EVAL_NAME}.json", result)
        label = f"{workload['preset']} ({workload['size']})"
        heading = f"# {run_dir}\n\nstep {trained['train_step']}, eval {result['eval_s']} s"
        write_text(run_dir / f"{EVAL_NAME}.md", markdown({label: result}, heading))
        plot({label: result}, run_dir)
        print(f"{run_dir}: " + ", ".join(f"{m}x ppl {v['ppl']:.2f}" for m, v in result["perplexity"].items()))


# ---- compare ----

def _compare(args) -> None:
    from asentmax.lm.report import markdown, plot
    from asentmax.runs import check_distinct_runs, read_json, training_cut

    check_distinct_runs(args.run_dirs)
    results, rows = {}, []
    for run_dir in args.run_dirs:
        result = read_json(run_dir / f"{EVAL_NAME}.json", "LM evaluation (run `asentmax lm eval` first)")
        if "train_step" not in result:  # files before the fifty-second session called it "step"
            raise ValueError(f"{run_dir / EVAL_NAME}.json has no train_step: "
                             "run `asentmax lm eval` on it again")
        label = f"{result['workload']['preset']} ({result['workload']['size']})"
        if label in results:  # runs of one preset and size (other seeds, steps or block options)
            label = f"{label} [{run_dir.name}]"
        cut = training_cut(result)
        if cut:  # lm_eval.json files written before the thirteenth session have no train_config
            label = f"{label}, cut at {cut[0]} of {cut[1]} steps"
        if label in results:
            raise ValueError(f"two runs compare as {label}: give their directories different names")
        results[label] = result
        train_file = run_dir / "lm_train.json"
        train = json.loads(train_file.read_text()) if train_file.is_file() else {}
        rows.append(f"| {label} | {result['n_parameters'] / 1e6:.1f}M | {result['train_step']} | "
                    f"{train.get('token_slots_seen', '')} | {_round(train.get('epochs'))} | "
                    f"{_round(train.get('elapsed_s'))} | {result['eval_s']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    runs = ["| run | parameters | steps | token slots seen | epochs | train s | eval s |",
            "|---|---|---|---|---|---|---|", *rows]
    header = "# LM comparison\n\n" + "\n".join(runs) + f"\n\ncommand: `asentmax {' '.join(sys.argv[1:])}`"
    (args.out / "compare.md").write_text(markdown(results, header))
    written = plot(results, args.out)
    print(f"wrote {args.out / 'compare.md'}, " + ", ".join(str(p) for p in written))


def _round(value):
    return "" if value is None else round(float(value), 2)

