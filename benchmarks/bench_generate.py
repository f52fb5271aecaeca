"""KV-cache decoding with `generate`: the package's cache (new slots written in place into buffers with room,
asentmax.nn.cache) beside a cache that concatenates every step (the package's cache before the twenty-third
session, rebuilt here as the peer), in the same run, on the CPU or a GPU (issue 14).

The LM preset lm_25m (8 layers, d_model 384, 6 heads of dim 64, 2 KV heads, NAPE) with random weights and a
4,096-token vocabulary; on CUDA under bf16 autocast, as `asentmax eval`. For each normaliser and prompt
length: one prefill into each cache (the package's with generate()'s capacity, prompt + new tokens), then
--new greedy decoding steps as generate() makes them, timed alone (the prefill, the same for both caches,
would swamp them), the fastest of --repeats runs after a warm-up run, the cache rewound to the prefill between
runs. Both caches must give the same tokens (checked). --compile adds torch.compile(model, fullgraph=True)
with each cache, compiled afresh for each prompt. --cuda-graph (CUDA only) adds generate(cuda_graph=True)'s
decoding: a static cache whose steps replay one CUDA graph (nn/generation.CapturedStep), timed the same way
(its first run records the graph); the share of its tokens equal to the buffered cache's is reported (the
entmax family runs the same kernels either way, so anything below 100 % there needs a look; softmax's eager
steps without a mask run on SDPA, and a near-tie can round the other way).

    PYTHONPATH=src python benchmarks/bench_generate.py --out results
writes results/generate_<device>.{md,json}.
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from asentmax import precision
from asentmax.nn import KVCache, Transformer, lm_25m
from asentmax.nn.generation import CapturedStep

VOCAB = 4096


class ConcatenatingCache(KVCache):
    """The peer: each step's keys and values concatenated to the cache (a copy of the whole cache a step)."""

    def update(self, layer, k, v):
        if layer == len(self.keys):
            self.keys.append(k.contiguous())
            self.values.append(v.contiguous())
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        return self.keys[layer], self.values[layer]


def rewind_point(state: dict) -> dict:
    """A cache's attributes with their lists copied: restoring it undoes every later step."""
    return {name: list(x) if isinstance(x, list) else x for name, x in state.items()}


def fastest_run(step, logits, rewind, new_tokens, device, repeats):
    """(fastest ms per decoded token over `repeats` timed runs after a warm-up run, the tokens of the last
    run). A run calls rewind(), then takes `new_tokens` greedy steps from the prefill's `logits`, each
    step(token) -> the next logits (B, V)."""
    best = float("inf")
    for _ in range(repeats + 1):  # the first run warms up (and compiles, or records a graph)
        rewind()
        token, tokens = logits.argmax(-1), []
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(new_tokens):
            tokens.append(token)
            token = step(token).argmax(-1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 1000 * best / new_tokens, torch.stack(tokens, 1)


def decoding_ms_per_token(call, cache, ids, new_tokens, device, repeats):
    """fastest_run of greedy steps from one prefill of `ids` into `cache`. The cache is rewound to the
    prefill between runs: its attributes restored, so that every run appends to the same prefilled slots, as
    generate() would."""
    autocast = precision.autocast(device, precision.autocast_dtype("auto", device))
    with torch.no_grad(), autocast:
        logits = call(ids, cache=cache)[:, -1]
        prefilled = rewind_point(vars(cache))
        return fastest_run(lambda token: call(token[:, None], cache=cache)[:, -1], logits,
                           lambda: vars(cache).update(rewind_point(prefilled)), new_tokens, device, repeats)


def graph_ms_per_token(model, ids, new_tokens, device, repeats):
    """fastest_run of steps replayed from a CUDA graph over a static cache: one CapturedStep for every run
    (the first runs its first step eagerly and records the second), the cache's device counts rewound in
    place to the prompt between runs (the graph reads those very tensors)."""
    cache = KVCache(capacity=ids.shape[1] + new_tokens, static=True)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(ids, cache=cache)[:, -1]
        prompt_counts = cache.n_real.clone()

        def rewind():
            cache.n_real.copy_(prompt_counts)
            if cache.kv_lengths is not None:
                cache.kv_lengths.fill_(ids.shape[1])

        return fastest_run(CapturedStep(model, cache), logits, rewind, new_tokens, device, repeats)


def cpu_name():
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table_row(row):
    peer, ours = row["concatenating_ms_per_token"], row["buffered_ms_per_token"]
    line = (f"| {row['normaliser']} | {row['prompt']} | {row['mode']} | {peer:.2f} | {ours:.2f} | "
            f"{peer / ours:.2f}x |")
    if "graph_ms_per_token" in row:
        graph = row["graph_ms_per_token"]
        line += f" {graph:.3f} | {ours / graph:.2f}x | {row['graph_tokens_equal']:.0%} |"
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompts", type=int, nargs="+", default=[256, 1024, 4096], help="prompt tokens")
    parser.add_argument("--new", type=int, default=64, help="generated tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--normalisers", nargs="+", default=["softmax", "asentmax"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also time generate(cuda_graph=True)'s steps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="folder for generate_<device>.{md,json}")
    args = parser.parse_args()
    if args.new < 1 or args.repeats < 1:
        parser.error("--new and --repeats must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.cuda_graph and device.type != "cuda":
        parser.error("--cuda-graph needs --device cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    command = (f"PYTHONPATH=src python benchmarks/bench_generate.py --device {args.device} "
               f"--batch {args.batch} --prompts {' '.join(map(str, args.prompts))} --new {args.new} "
               f"--repeats {args.repeats}"
               f"{' --compile' if args.compile else ''}{' --cuda-graph' if args.cuda_graph else ''}"
               " --out DIR")
    precision = "bf16 autocast" if device.type == "cuda" else "fp32"
    header = (f"# generate() decoding: buffered KV cache vs concatenating peer ({device.type}: {name}, torch "
              f"{torch.__version__}, {torch.get_num_threads()} threads)\n\n"
              f"lm_25m, vocab {VOCAB}, NAPE, batch {args.batch}, {args.new} new tokens, fastest of "
              f"{args.repeats}, {precision}. Command: `{command}`\n\n"
              "| normaliser | prompt | mode | concatenating ms/token | buffered ms/token | "
              "concatenating / buffered |" + (" CUDA graph ms/token | buffered / graph | graph tokens equal |"
                                              if args.cuda_graph else "")
              + "\n|---|---|---|---|---|---|" + ("---|---|---|" if args.cuda_graph else ""))
    print(header, flush=True)
    rows = []
    for normaliser in args.normalisers:
        torch.manual_seed(0)
        model = Transformer(lm_25m(VOCAB, attention=normaliser)).to(device).eval()
        for prompt in args.prompts:
            generator = torch.Generator().manual_seed(prompt)
            ids = torch.randint(0, VOCAB, (args.batch, prompt), generator=generator).to(device)
            modes = [("eager", model)]
            if args.compile:  # compiled afresh for each prompt: both cache classes and every prompt length
                torch._dynamo.reset()  # through one compiled forward would pass dynamo's recompile limit (8)
                modes.append(("compiled", torch.compile(model, fullgraph=True)))
            for mode, call in modes:
                peer, peer_tokens = decoding_ms_per_token(call, ConcatenatingCache(), ids, args.new, device,
                                                          args.repeats)
                ours, tokens = decoding_ms_per_token(call, KVCache(capacity=prompt + args.new), ids, args.new,
                                                     device, args.repeats)
                if not torch.equal(tokens, peer_tokens):
                    raise SystemExit(f"{normaliser} {mode} prompt {prompt}: the two caches decoded different "
                                     "tokens")
                row = dict(normaliser=normaliser, prompt=prompt, mode=mode, concatenating_ms_per_token=peer,
                           buffered_ms_per_token=ours)
                if args.cuda_graph and mode == "eager":
                    graph, graph_tokens = graph_ms_per_token(model, ids, args.new, device, args.repeats)
                    equal = (graph_tokens == tokens).float().mean().item()
                    row.update(graph_ms_per_token=graph, graph_tokens_equal=equal)
                rows.append(row)
                print(table_row(row), flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        lines = [header] + [table_row(row) for row in rows]
        (args.out / f"generate_{device.type}.md").write_text("\n".join(lines) + "\n")
        (args.out / f"generate_{device.type}.json").write_text(json.dumps(
            dict(device=name, torch=torch.__version__, args={k: str(v) for k, v in vars(args).items()},
                 rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
