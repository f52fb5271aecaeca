"""Which SSMax formulation gets right gradients from torch.compile + Inductor on this GPU (issue 14).

SSMax (arXiv:2506.16640, section 2; docs/method.md section 4) scales query i of head h by
theta_hi = delta + s_h log(n_i + 1). On the H200 (torch 2.11) Inductor's CUDA code returned a wrong gradient
of s when log(n_i + 1) entered theta as a (B, 1, T) tensor (results/gpu_tests_session4.md,
results/gpu_tests_session5.md), so SSMax trained eagerly until this script's H200 run
(results/gpu_tests_session8.md: only the kernel route was right) moved it onto the fused kernel. This script
compiles each candidate formulation below and prints, one line per candidate, the relative error
max |g - g_eager| / max |g_eager| of the worst parameter gradient (and of s) against eager fp32 on the same
device, for

  isolated  B=4, H=8, T=130, D=16: q, k, v leaves, theta from the package's SSMaxTemperature, causal
            attention by the candidate's route, loss mean(out^2); gradients of s, q, k, v;
  static    the model of tests/test_compile_gpu.py (2 layers, d_model 128, 8 heads, NoPE: every head
            scaled), torch.compile(fullgraph=True), ids (4, 130), loss mean(logits^2), two steps;
  trainer   the same model under NAPE compiled as the trainer does (asentmax.trainer.compiled_for_training:
            sequence length dynamic), steps at lengths 130, 67, 130;
  bf16      (not run by default) trainer under bf16 autocast, as the trainer runs on CUDA, eager also in
            bf16: limits 0.1 (gradients) and 0.05 (logits) for the rounding of two bf16 computations; the
            fp32 failure was 0.2 to 1e6.

Every part runs twice or more, and the worst step counts: a stale or unwritten buffer once showed as a
0.22 error at the first call and 2181 at later ones. Each (candidate, part) runs in its own process, in
parallel (fresh Inductor and Triton caches each), so that one run takes about a minute on one H200 host.

Candidates (the package's code, patched in the child process; nothing here changes the package):
  product           the old form: log(n_i + 1) as (B, 1, T), theta (B, m, T); SDPA. The H200 failure.
  broadcast         the package's theta: one row of log(n_i + 1), (1, 1, T), when nothing is padded
                    (training), theta (1, H, T) expanded to (B, H, T); SDPA. Exact in the isolated check of
                    the fourth session, wrong in a model in the eighth's.
  matmul            theta = delta + log_n (B*T, 1) @ s (1, m): d s = log_n^T @ d theta is a matmul (cuBLAS)
                    instead of a reduction in Inductor's generated code; SDPA.
  kernel            the package's form: broadcast, but attention by entmax_attention(alpha=1), the fused
                    Triton kernel's softmax mode, which returns d theta itself (ASEntmax's route, whose
                    compiled gradients are right on the H200; nn/normalisers.py: ssmax's sdpa off).
  asentmax          control: the package's ASEntmax (it reads the same one-row log(n_i + 1)).

The H200 run of the eighth session found product, broadcast and matmul wrong in the static model (2.8e6)
and kernel right in every part, so the package took the kernel route.
(results/gpu_tests_session5.md: the product form stayed wrong with Inductor's mix-order reduction off.)

    PYTHONPATH=src python benchmarks/diagnose_ssmax_compile.py                   # the H200
    PYTHONPATH=src python benchmarks/diagnose_ssmax_compile.py --candidates product broadcast --parts isolated
On a machine without CUDA it says so and runs on the CPU (Inductor's C++ code, where the H200 failure does
not reproduce): a check that the script runs, not the diagnosis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

CANDIDATES = {  # name -> (attention, patches of apply_patches)
    "product": ("ssmax", ("rows", "sdpa")),
    "broadcast": ("ssmax", ("sdpa",)),
    "matmul": ("ssmax", ("rows", "matmul", "sdpa")),
    "kernel": ("ssmax", ()),
    "asentmax": ("asentmax", ()),
}
PARTS = ("isolated", "static", "trainer", "bf16")
DEFAULT_PARTS = PARTS[:3]
LIMITS = {"bf16": (1e-1, 5e-2)}  # (gradient, logits); else tests/test_compile_gpu.py's fp32 limits:
FP32_LIMITS = (1e-2, 1e-3)
VOCAB, BATCH, LENGTH = 64, 4, 130


def apply_patches(patches):
    """Turn the package's SSMax into a candidate's form (in this process only)."""
    from asentmax.nn import normalisers
    from asentmax.nn.attention import AttentionContext
    from asentmax.nn.temperature import SSMaxTemperature, _with_unscaled_heads, log_key_counts
    from asentmax.ops.entmax import compute_dtype

    if "rows" in patches:  # log(n_i + 1) per batch row, (B, 1, T), as before the one-row form
        def log_n_keys(self, dtype):
            if dtype not in self._log_n_keys:
                self._log_n_keys[dtype] = log_key_counts(self.n_keys, dtype)
            return self._log_n_keys[dtype]
        AttentionContext.log_n_keys = log_n_keys
    if "matmul" in patches:
        def forward(self, x, n_keys, log_n=None):
            dtype = compute_dtype(x.dtype)
            if log_n is None:
                log_n = log_key_counts(n_keys, dtype)
            rows, t = log_n.shape[0], log_n.shape[-1]
            scaled = torch.mm(log_n.reshape(rows * t, 1), self.s.to(dtype)[None, :])  # (rows * T, m)
            theta = self.delta + scaled.view(rows, t, -1).transpose(1, 2)
            return _with_unscaled_heads(theta, self.n_heads).expand(n_keys.shape[0], -1, -1)
        SSMaxTemperature.forward = forward
    if "sdpa" in patches:  # SSMax through torch SDPA, as before the package took the kernel's route
        table = normalisers._BY_NAME
        table["ssmax"] = dataclasses.replace(table["ssmax"], sdpa=True)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)).item()


def compare(errors: dict, grads: dict, eager: dict):
    """Fold one step's per-gradient errors into `errors` (the worst over steps)."""
    for name, want in eager.items():
        got = grads.get(name)
        e = float("inf") if got is None else relative_error(got, want)
        errors[name] = max(errors.get(name, 0.0), e)


def run_isolated(device, backend):
    from asentmax.nn import ModelConfig
    from asentmax.nn.attention import AttentionContext
    from asentmax.nn.normalisers import get_normaliser
    from asentmax.nn.temperature import SSMaxTemperature
    from asentmax.ops.attention import entmax_attention

    heads, dim = 8, 16
    temperature = SSMaxTemperature(ModelConfig(vocab_size=VOCAB, d_model=heads * dim, n_layers=1,
                                               n_heads=heads, d_ff=256, attention="ssmax",
                                               position="nope")).to(device)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        temperature.s.copy_(0.3 * torch.randn(heads, generator=gen).abs())
    qkv = [torch.randn(BATCH, heads, LENGTH, dim, generator=gen).to(device) for _ in range(3)]

    def loss_of(q, k, v):
        b, _, t, d = q.shape
        n_keys = torch.arange(1, t + 1, device=q.device).expand(b, t)
        ctx = AttentionContext(positions=n_keys - 1, n_keys=n_keys, query_mask=None, key_padding_mask=None,
                               n_total=t, slopes=None)
        theta = temperature(q.transpose(1, 2), n_keys, ctx.log_n_keys(torch.float32))  # x: its dtype only
        if get_normaliser("ssmax").sdpa:  # nn/attention.py Attention._sdpa's fold
            out = F.scaled_dot_product_attention(q * (theta / math.sqrt(d))[..., None], k, v,
                                                 is_causal=True, scale=1.0)
        else:
            out = entmax_attention(q, k, v, alpha=1.0, causal=True, q_scale=theta)
        return out.square().mean()

    def step(call):
        leaves = [t.clone().requires_grad_(True) for t in qkv]
        temperature.zero_grad()
        call(*leaves).backward()
        return {"s": temperature.s.grad.clone(), **{n: t.grad for n, t in zip("qkv", leaves, strict=True)}}

    eager = step(loss_of)
    compiled = torch.compile(loss_of, backend=backend, fullgraph=True)
    errors = {}
    for _ in range(3):
        compare(errors, step(compiled), eager)
    return errors, None


def run_model(device, backend, attention, part):
    from asentmax.nn import ModelConfig, Transformer
    from asentmax.trainer import compiled_for_training

    position = "nope" if part == "static" else "nape"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=part == "bf16")
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=128, n_layers=2, n_heads=8, d_ff=256, topk_k=8,
                      attention=attention, position=position)
    model = Transformer(cfg).to(device)
    with torch.no_grad():  # nonzero temperature parameters (they start at zero), as tests/conftest.py
        for block in model.blocks:
            for p in block.attn.temperature.parameters():
                p.copy_(0.3 * torch.randn_like(p).abs())

    def step(call, ids):
        model.zero_grad()
        with autocast:
            logits = call(ids)
        logits.float().square().mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    if part == "static":
        compiled, lengths = torch.compile(model, backend=backend, fullgraph=True), (LENGTH, LENGTH)
    else:
        compiled, lengths = compiled_for_training(model, backend), (LENGTH, 67, LENGTH)
    errors, logit_error = {}, 0.0
    for length in lengths:
        gen = torch.Generator().manual_seed(length)
        ids = torch.randint(0, VOCAB, (BATCH, length), generator=gen).to(device)
        eager_logits, eager = step(model, ids)
        logits, grads = step(compiled, ids)
        logit_error = max(logit_error, relative_error(logits, eager_logits))
        compare(errors, grads, eager)
    return errors, logit_error


def child(args):
    """One (candidate, part) in this process; prints one JSON line."""
    attention, patches = CANDIDATES[args.child]
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # eager and compiled in true fp32
    torch.backends.cudnn.allow_tf32 = False
    apply_patches(patches)
    start = time.perf_counter()
    if args.part == "isolated":
        errors, logit_error = run_isolated(device, args.backend)
    else:
        errors, logit_error = run_model(device, args.backend, attention, args.part)
    worst = max(errors, key=errors.get)
    form = form_in_use()
    s_errors = [e for n, e in errors.items() if n == "s" or n.endswith("temperature.s")]
    print(json.dumps({"worst": worst, "worst_error": errors[worst], "s_error": max(s_errors, default=None),
                      "logit_error": logit_error, "limits": LIMITS.get(args.part, FP32_LIMITS), "form": form,
                      "seconds": time.perf_counter() - start}))


def form_in_use() -> str:
    """What this process's package computes, read back after the patches: the rows of log(n_i + 1) for an
    unpadded batch of 3, SSMax's theta function, and its attention route."""
    from asentmax.nn.attention import AttentionContext
    from asentmax.nn.normalisers import get_normaliser
    from asentmax.nn.temperature import SSMaxTemperature

    n_keys = torch.arange(1, 6).expand(3, 5)
    ctx = AttentionContext(positions=n_keys - 1, n_keys=n_keys, query_mask=None, key_padding_mask=None,
                           n_total=5, slopes=None)
    rows = ctx.log_n_keys(torch.float32).shape[0]
    theta = "patched" if "<locals>" in SSMaxTemperature.forward.__qualname__ else "package"
    route = "sdpa" if get_normaliser("ssmax").sdpa else "kernel"
    return f"log_n rows {rows}, theta {theta}, {route}"


def launch(candidate, part, args, threads, cache_root):
    """The child process of (candidate, part), its output to files in its own directory (a pipe that
    nobody reads while it runs could fill with compile warnings and stall it)."""
    folder = os.path.join(cache_root, f"{candidate}-{part}")
    os.makedirs(folder)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
           "TRITON_CACHE_DIR": os.path.join(folder, "triton"), "TORCHINDUCTOR_COMPILE_THREADS": str(threads)}
    command = [sys.executable, os.path.abspath(__file__), "--child", candidate, "--part", part,
               "--device", args.device, "--backend", args.backend]
    with open(os.path.join(folder, "out"), "w") as out, open(os.path.join(folder, "err"), "w") as err:
        return subprocess.Popen(command, env=env, stdout=out, stderr=err), folder


def outcome(process, folder) -> dict:
    """The child's JSON line, or why there is none."""
    with open(os.path.join(folder, "out")) as out, open(os.path.join(folder, "err")) as err:
        lines, errors = [line for line in out if line.startswith("{")], err.read().strip().splitlines()
    if process.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"failed": f"error: {(errors or ['no output'])[-1][:160]}"}


def cell(result) -> str:
    if "failed" in result:
        return result["failed"]
    s = "-" if result["s_error"] is None else f"{result['s_error']:.1e}"
    return f"{result['worst_error']:.1e} {result['worst']} (s {s})"


def right(result) -> bool:
    gradient_limit, logit_limit = result["limits"]
    logits_ok = result["logit_error"] is None or result["logit_error"] < logit_limit
    return result["worst_error"] < gradient_limit and logits_ok


def verdict(row) -> str:
    """WRONG when a part that ran is wrong, else "not run" when a part did not finish, else right."""
    done = [r for r in row if r is not None and "failed" not in r]
    if not all(right(r) for r in done):
        return "WRONG"
    return "right" if len(done) == sum(r is not None for r in row) else "not run"


def main(argv=None) -> tuple[list[list[str]], dict[str, str]]:
    """Runs the candidates; returns the printed table's rows (header first) and what each candidate ran."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(DEFAULT_PARTS))
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: none)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--jobs", type=int, default=None, help="processes at once (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    parser.add_argument("--child", choices=list(CANDIDATES), help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return [], {}
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu":
        why = "as asked" if torch.cuda.is_available() else "no CUDA device"
        print(f"running on the CPU ({why}), where Inductor writes C++ and the H200 failure does not "
              "reproduce: this checks that the script runs, it diagnoses nothing", flush=True)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, {device_name}, backend {args.backend}; relative error of the worst "
          f"gradient vs eager (and of s); right = every gradient < {FP32_LIMITS[0]:g}, logits < "
          f"{FP32_LIMITS[1]:g} (bf16: {LIMITS['bf16'][0]:g}, {LIMITS['bf16'][1]:g})", flush=True)

    jobs = [(c, p) for c in args.candidates for p in args.parts
            if not (p == "isolated" and CANDIDATES[c][0] != "ssmax")]
    width = args.jobs or len(jobs)
    threads = max(1, (os.cpu_count() or 1) // width)
    results, running, waiting = {}, {}, list(jobs)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="diagnose_ssmax_") as cache_root:
        while waiting or running:
            while waiting and len(running) < width:
                job = waiting.pop(0)
                running[job] = (*launch(*job, args, threads, cache_root), time.perf_counter())
            time.sleep(0.2)
            for job, (process, folder, began) in list(running.items()):
                if process.poll() is None:
                    if time.perf_counter() - began > args.timeout:
                        process.kill()
                        process.wait()
                        results[job] = {"failed": f"timed out after {args.timeout:g} s"}
                        del running[job]
                    continue
                results[job] = outcome(process, folder)
                del running[job]

    table = [["candidate", "verdict", *args.parts]]
    for candidate in args.candidates:
        row = [results.get((candidate, p)) for p in args.parts]
        table.append([candidate, verdict(row), *("-" if r is None else cell(r) for r in row)])
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    print()
    for line in table:
        print(" | ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())
    forms = {c: r["form"] for (c, _), r in results.items() if "form" in r}
    print("\nwhat each ran: " + "; ".join(f"{c}: {forms.get(c, '?')}" for c in args.candidates))
    slowest = max((r.get("seconds", 0.0) for r in results.values()), default=0.0)
    print(f"\n{time.perf_counter() - start:.0f} s in all ({len(jobs)} processes, {width} at once, "
          f"slowest {slowest:.0f} s)")
    return table, forms


if __name__ == "__main__":
    main()
