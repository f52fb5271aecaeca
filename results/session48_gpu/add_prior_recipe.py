"""Run once in the forty-eighth session (from the repository root, after benchmarks/record_runs.py): add
"prior_recipe" to the records of the two ASEntmax runs whose starts --steps-after-escape ended.

The device ran main at 3200150, before the trainer kept the start's configs as prior_recipe
(runs.prior_recipe); without it `asentmax compare` tells these runs' starts apart by their lengths (14,600
and 23,760 steps), which differ by seed by design. The field is what the trainer now writes: the start's
train_config, workload, model_config and prior_samples, here read from the start's recorded config.json (the
start was neither resumed nor extended, so its checkpoint held the same configs). Nothing else changes.
"""

import json
from pathlib import Path

M = Path("results/paper/mqmtar")
for seed in (3, 5):
    start_dir = M / f"softmax_b128_dense_start_escape_paper_blocks_seed{seed}"
    start = json.loads((start_dir / "config.json").read_text())
    prior = {key: start[key] for key in ("train_config", "workload", "model_config", "prior_samples")}
    run = M / f"asentmax_b128_64k_from_softmax_escape_paper_blocks_seed{seed}"
    init_step = json.loads((run / "config.json").read_text())["init_from"]["step"]
    for name in ("config.json", "eval.json", "eval_fresh.json", "eval_best.json"):
        record = json.loads((run / name).read_text())
        assert "prior_recipe" not in record
        assert record["prior_samples"] == start["train_config"]["batch_size"] * init_step
        (run / name).write_text(json.dumps({**record, "prior_recipe": prior}, indent=2) + "\n")
