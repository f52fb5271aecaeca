"""lm-evaluation-harness model "asentmax": the package's models (a save_hf directory) under lm_eval.

    python -m asentmax.integrations.lm_eval --model asentmax --model_args pretrained=DIR \
        --tasks asentmax_needle

lm_eval 0.4.13 finds models only in its own registry (no entry points), so `lm_eval --model asentmax`
works only after `import asentmax.integrations.lm_eval`; this module's main() (also the console script
`asentmax-lm-eval`) imports it, adds the shipped local tasks (lm_eval_tasks/: asentmax_needle) with
--include_path, and runs lm_eval's own command line. From Python: lm_eval.simple_evaluate(model=
AsentmaxLM(pretrained=DIR), tasks=[...], task_manager=task_manager()).

AsentmaxLM scores with the package's Transformer (forward with a right-padding attention mask) and
generates with Transformer.generate (KV cache; on a GPU its steps replay CUDA graphs unless model_args say
cuda_graphs=off: asentmax.nn.generation.decodes_with_cuda_graph), greedy unless the task asks for sampling:
  loglikelihood          sum of log p(continuation | context), and whether greedy decoding produces it
  loglikelihood_rolling  log p(text | prefix token) over lm_eval's rolling windows of max_length tokens
                         (perplexity: lm_eval turns it into word/byte perplexity and bits per byte)
  generate_until         the continuation cut at the first stop string (gen_kwargs "until")
Precision: model_args dtype (the weights', default float32) and amp (auto: bf16 autocast on a CUDA device, as
`asentmax train` and `asentmax eval` run, none on a CPU | bf16 | off). On a GPU, fp32 weights without
autocast send fp32 inputs to the fused attention kernels, which run 18-224x slower than in bf16 on an H100
(results/fp32_kernels_sm90.md): pass amp=off only for fp32 scores on purpose.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from transformers import AutoTokenizer

from asentmax import precision
from asentmax.integrations.hf_model import load_hf
from asentmax.nn.generation import decodes_with_cuda_graph

TASKS_DIR = Path(__file__).resolve().with_name("lm_eval_tasks")
MODEL_NAME = "asentmax"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def task_manager(include_path: str | Path | None = None, include_defaults: bool = False):
    """An lm_eval TaskManager knowing the shipped local tasks (and include_path, if given); lm_eval's own
    tasks only with include_defaults=True (indexing them takes seconds)."""
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR)] + ([] if include_path is None else [str(include_path)])
    return TaskManager(include_path=paths, include_defaults=include_defaults)


@register_model(MODEL_NAME)
class AsentmaxLM(TemplateLM):
    def __init__(self, pretrained: str, device: str | None = None, batch_size: int | str = 1,
                 max_length: int = 2048, max_gen_toks: int = 256, dtype: str = "float32",
                 max_batch_size: int | None = None, cuda_graphs: str = "auto", amp: str = "auto"):
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if amp not in precision.EVAL_AMP_MODES:
            raise ValueError(f"amp must be one of {', '.join(precision.EVAL_AMP_MODES)}, got {amp!r}")
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"batch_size must be a positive int (no 'auto'), got {batch_size!r}")
        # lm_eval's command line passes cuda:0 unless told otherwise
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self._device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for but CUDA is not available: pass --device cpu")
        self.model = load_hf(pretrained).model.to(device=self._device, dtype=DTYPES[dtype]).eval()
        self.autocast_dtype = precision.autocast_dtype(amp, self._device)  # of every model call (None: none)
        self.cuda_graph = decodes_with_cuda_graph(cuda_graphs, self.model.config, self._device.type,
                                                  name="cuda_graphs")
        self.tokenizer = AutoTokenizer.from_pretrained(pretrained, local_files_only=True)
        if self.tokenizer.eos_token_id is None:
            raise ValueError(f"the tokenizer in {pretrained} has no eos token (lm_eval's end of text and "
                             "prefix token)")
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.max_gen_toks = int(max_gen_toks)

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def device(self):
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation) | None, context tokens, continuation tokens)."""
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            # the model reads everything but the last token; the continuation's logits are the last ones
            inputs = [(requests[i][1] + requests[i][2])[-(self.max_length + 1):][:-1] for i in chunk]
            width = max(len(x) for x in inputs)
            ids = torch.full((len(chunk), width), self.eot_token_id, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.bool)
            for row, tokens in enumerate(inputs):
                ids[row, :len(tokens)] = torch.tensor(tokens)
                mask[row, :len(tokens)] = True
            with precision.autocast(self._device, self.autocast_dtype):
                logits = self.model(ids.to(self._device), attention_mask=mask.to(self._device))
            for row, i in enumerate(chunk):
                if len(requests[i][2]) > self.max_length:
                    raise ValueError(f"a continuation of {len(requests[i][2])} tokens does not fit in "
                                     f"max_length={self.max_length}")
                continuation = torch.tensor(requests[i][2], device=self._device)
                n = len(continuation)
                end = len(inputs[row])
                logprobs = F.log_softmax(logits[row, end - n:end].float(), dim=-1)
                answer = (float(logprobs.gather(1, continuation[:, None]).sum()),
                          bool((logprobs.argmax(-1) == continuation).all()))
                results[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for request in requests:
            (text,) = request.args
            windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1)]
            scores = self._loglikelihood_tokens([(None, context, target) for context, target in windows])
            total = sum(score for score, _ in scores)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            context, gen_kwargs = request.args
            gen_kwargs = dict(gen_kwargs)
            until = gen_kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(gen_kwargs.pop("max_gen_toks", self.max_gen_toks))
            do_sample = bool(gen_kwargs.pop("do_sample", False))
            temperature = float(gen_kwargs.pop("temperature", 0.0)) if do_sample else 0.0
            gen_kwargs.pop("temperature", None)
            unknown = sorted(gen_kwargs)
            if unknown:
                raise ValueError(f"generation arguments not supported by the asentmax model: {unknown}")
            tokens = self.tok_encode(context)[-max(1, self.max_length - max_new):] or [self.prefix_token_id]
            ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
            with precision.autocast(self._device, self.autocast_dtype):
                new = self.model.generate(ids, max_new, temperature=temperature,
                                          eos_token_id=self.eot_token_id,
                                          cuda_graph=self.cuda_graph)[0, len(tokens):].tolist()
            if self.eot_token_id in new:
                new = new[:new.index(self.eot_token_id)]
            text = self.tok_decode(new)
            for stop in until:
                text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", request.args, text)
            out.append(text)
        return out


def main(argv: list[str] | None = None) -> None:
    """lm_eval's command line with the "asentmax" model registered and the shipped tasks included."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in argv:
        argv += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm_eval", *argv]
    cli_evaluate()


if __name__ == "__main__":
    main()
