"""GPU benchmark of greedy KV-cache decoding for every normaliser, side by side in one run (issue 14, item 4).

The Reverse preset model (6 layers, d_model 256, 8 heads, NAPE), random weights, bf16 autocast as
`asentmax eval`; for each normaliser, `generate` on a batch of prompts, timed after one warm-up run:
seconds per call and ms per generated token. --compile also times torch.compile(model, fullgraph=True).

    PYTHONPATH=src python benchmarks/bench_generate_gpu.py --batch 64 --prompt 98 --new 97
"""

import argparse
import time

import torch

from asentmax.nn import Transformer, reverse_model
from asentmax.nn.generation import generate
from asentmax.nn.normalisers import NAMES


def seconds(call, ids, new_tokens, repeats):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        generate(call, ids, new_tokens)  # warm-up (and compilation)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            generate(call, ids, new_tokens)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=98, help="prompt tokens")
    parser.add_argument("--new", type=int, default=97, help="generated tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    ids = torch.randint(3, 60, (args.batch, args.prompt), device="cuda")
    print(f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens, {torch.cuda.get_device_name()}")
    print("| normaliser | mode | s per generate | ms per token |\n|---|---|---|---|")
    for name in NAMES:
        torch.manual_seed(0)
        model = Transformer(reverse_model(64, attention=name)).cuda().eval()
        modes = [("eager", model)]
        if args.compile:
            torch._dynamo.reset()
            modes.append(("compiled", torch.compile(model, fullgraph=True)))
        for mode, call in modes:
            s = seconds(call, ids, args.new, args.repeats)
            print(f"| {name} | {mode} | {s:.3f} | {1000 * s / args.new:.2f} |")


if __name__ == "__main__":
    main()
