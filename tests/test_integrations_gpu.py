"""GPU checks of the Hugging Face integration (run on the H200; skipped in CI): the Triton kernels under
transformers (attn_implementation="entmax") give logits and gradients as close to an fp64 run of the same
weights as the reference backend does, in fp32 and bf16, left padding included; cached generation equals
uncached generation; the package's model as AsentmaxForCausalLM and under lm_eval runs in bf16 on CUDA close
to fp32."""

from contextlib import contextmanager

import pytest
import torch

transformers = pytest.importorskip("transformers")

import asentmax.ops.triton as triton_ops  # noqa: E402
from asentmax.integrations import hf  # noqa: E402
from asentmax.integrations.hf_model import AsentmaxConfig, AsentmaxForCausalLM, save_hf  # noqa: E402
from asentmax.integrations.tokenizer import BYTE_VOCAB_SIZE, byte_tokenizer  # noqa: E402
from asentmax.nn import ModelConfig, Transformer  # noqa: E402
from conftest import left_padded  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
DEVICE = torch.device("cuda")
HALF = torch.bfloat16
VOCAB = 256
LENGTH = 384


def llama(dtype, backend="triton", alpha=1.5, device=DEVICE):
    """The tiny Llama with seed-0 weights rounded to `dtype` (float64 after a narrower dtype: the same rounded
    weights, computed exactly)."""
    hf.register()
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=4096, initializer_range=0.1, pad_token_id=0,
        bos_token_id=None, eos_token_id=None, entmax_alpha=alpha, entmax_backend=backend)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="entmax")
    return model.to(device=device, dtype=dtype)


@contextmanager
def counted_kernel_calls():
    """Counts calls of the Triton attention entry point (proves the kernels ran under transformers)."""
    original = triton_ops.triton_entmax_attention
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    triton_ops.triton_entmax_attention = counting
    try:
        yield calls
    finally:
        triton_ops.triton_entmax_attention = original


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


GRAD_NAMES = ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
              "model.layers.0.self_attn.v_proj.weight", "model.embed_tokens.weight")
# allowed error of the Triton run = FACTOR * (the reference backend's error in the same dtype) + FLOOR[dtype],
# both relative to the fp64 run of the same rounded weights
FACTOR = 1.5
FLOOR = {torch.float32: 1e-4, HALF: 1e-2}


def logits_and_grads(model, ids, mask, positions):
    """(logits of the real tokens, {name: gradient} for GRAD_NAMES) of loss = mean logsumexp (in fp64)."""
    real = mask.bool()
    logits = model(ids, attention_mask=mask, position_ids=positions).logits
    logits[real].double().logsumexp(-1).mean().backward()
    grads = {name: model.get_parameter(name).grad.cpu() for name in GRAD_NAMES}
    return {"logits": logits.detach()[real].cpu(), **grads}


def backend_errors(alpha, dtype, device=DEVICE, length=LENGTH):
    """Rows (dtype, quantity, reference error, Triton error, allowed) for one dtype: the tiny Llama in `dtype`
    with the reference and the Triton backend, each relative to the fp64 reference run (on the CPU) of the
    same rounded weights. Also checks the Triton kernels ran for the triton backend only."""
    ids, mask, positions = left_padded([length, length - 57], length, VOCAB)
    exact = logits_and_grads(llama(dtype, "reference", alpha, "cpu").double(), ids, mask, positions)
    ids, mask, positions = ids.to(device), mask.to(device), positions.to(device)
    runs = {}
    for backend in ("reference", "triton"):
        with counted_kernel_calls() as calls:
            runs[backend] = logits_and_grads(llama(dtype, backend, alpha, device), ids, mask, positions)
        assert bool(calls) == (backend == "triton"), f"{backend} backend: {len(calls)} Triton kernel calls"
    rows = []
    for quantity, r in exact.items():
        ref_err, triton_err = (relative_error(runs[b][quantity], r) for b in ("reference", "triton"))
        rows.append((dtype, quantity, ref_err, triton_err, FACTOR * ref_err + FLOOR[dtype]))
    return rows


@pytest.mark.parametrize("alpha", [1.5, 2.0])
def test_kernels_match_the_reference_backend_logits_and_gradients(alpha):
    """Same weights, only the attention backend differs: logits and gradients of the Triton run are as close
    to the fp64 run of the same rounded weights as the reference backend's run in the same dtype is (within
    FACTOR, plus a floor of a few rounding units), in fp32 and bf16.

    Why not Triton vs the reference directly: in bf16 neither is close to the exact answer. At alpha = 2
    (sparsemax) a third of the rows have support 1 (zero Jacobian) and the Jacobian jumps by 1/|S| when a key
    crosses the threshold; bf16 rounding of the activations moves keys across it (19% of the second layer's
    rows change support size), so the bf16 reference's gradients are 0.33-0.39 (relative) from the fp64 run
    of the same weights, the Triton run's 0.35-0.39 (no worse), and the two bf16 runs 0.23-0.26 from each
    other: above any fixed tolerance that would still mean something at alpha = 1.5, where the bf16
    reference is 0.10 from fp64. (Measured on the CPU: Triton interpreter, its bf16 tl.dot made to read
    bf16 operands. fp32 errors are ~1e-5 for both backends.)"""
    rows = [row for dtype in (torch.float32, HALF) for row in backend_errors(alpha, dtype)]
    table = "\n".join(f"  {str(dtype):15} {quantity:40} reference {ref:.3e}  triton {err:.3e}  "
                      f"allowed {allowed:.3e}{'' if err <= allowed else '  FAIL'}"
                      for dtype, quantity, ref, err, allowed in rows)
    print(table)
    assert all(err <= allowed for *_, err, allowed in rows), \
        f"alpha={alpha}: relative error vs the fp64 reference of the same weights\n{table}"


def test_bf16_left_padding_equals_unpadded_rows():
    model = llama(HALF)
    lengths = [LENGTH, 200, 31]
    ids, mask, positions = left_padded(lengths, LENGTH, VOCAB, device=DEVICE, seed=2)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=positions).logits
        for row, n in enumerate(lengths):
            alone = model(ids[row:row + 1, LENGTH - n:]).logits[0]
            assert relative_error(batch[row, LENGTH - n:], alone) < 1e-2


def test_generate_with_cache_equals_without_on_cuda():
    model = llama(torch.float32)  # fp32: greedy tokens comparable exactly (bf16 ties may flip)
    ids, mask, _ = left_padded([96, 40, 71], 96, VOCAB, device=DEVICE, seed=3)
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    with counted_kernel_calls() as calls:
        with_cache = model.generate(ids, use_cache=True, **kwargs)
    assert calls
    assert torch.equal(with_cache, model.generate(ids, use_cache=False, **kwargs))
    bf16 = llama(HALF).generate(ids, **kwargs)  # runs: prefill + decode kernels in bf16
    assert bf16.shape == with_cache.shape


def package_model(backend="auto") -> Transformer:
    config = ModelConfig(vocab_size=BYTE_VOCAB_SIZE, d_model=256, n_layers=2, n_heads=8, n_kv_heads=4,
                         d_ff=512, attention="asentmax", position="nape", init_std=0.1,
                         attention_backend=backend)
    torch.manual_seed(0)
    return Transformer(config).eval()


def as_hf(model: Transformer, dtype) -> AsentmaxForCausalLM:
    hf_model = AsentmaxForCausalLM(AsentmaxConfig.from_model_config(model.config)).eval()
    hf_model.model.load_state_dict(model.state_dict())
    return hf_model.to(DEVICE, dtype)


def test_asentmax_model_under_transformers_on_cuda():
    ids, mask, _ = left_padded([200, 120], 200, VOCAB, device=DEVICE, seed=4)
    real = mask.bool()
    for dtype, tol in ((torch.float32, 1e-4), (HALF, 3e-2)):
        with torch.no_grad():
            ref = as_hf(package_model("reference"), dtype)(ids, attention_mask=mask).logits[real]
            with counted_kernel_calls() as calls:
                out = as_hf(package_model("triton"), dtype)(ids, attention_mask=mask).logits[real]
        assert calls and relative_error(out, ref) < tol, dtype
    fp32, half = as_hf(package_model("triton"), torch.float32), as_hf(package_model("triton"), HALF)
    kwargs = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(fp32.generate(ids, **kwargs), fp32.generate(ids, use_cache=False, **kwargs))
    assert half.generate(ids, **kwargs).shape == (2, 210)


def test_lm_eval_model_bf16_on_cuda_matches_cpu_fp32(tmp_path):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from asentmax.integrations.lm_eval import AsentmaxLM

    model = package_model()
    save_hf(model, model.config, tmp_path, tokenizer=byte_tokenizer())
    pairs = [("Some special magic numbers are hidden here. amber is:", " 7463343"), ("a b c", " d e f")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    cpu = AsentmaxLM(pretrained=str(tmp_path), device="cpu").loglikelihood(requests)
    gpu = AsentmaxLM(pretrained=str(tmp_path), device="cuda", dtype=str(HALF).removeprefix("torch."),
                     batch_size=2).loglikelihood(requests)
    for (score_cpu, _), (score_gpu, _), (_, continuation) in zip(cpu, gpu, pairs, strict=True):
        assert abs(score_gpu - score_cpu) < 0.1 * len(continuation.encode())
