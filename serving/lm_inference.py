"""Language-model versions at inference: load a version (a LoRA adapter on its base model, or a
full model folder), generate greedy continuations of prompts, and score held-out records'
perplexity, all on CPU in the web or worker process (nothing downloads: the base model is the
local folder the adapter names, ``local_files_only``).

The prompt of a record is rendered exactly as training renders it (``training.lm.segments``):
an instruction row's Alpaca-style prompt up to ``### Response:``, a chat's messages up to its
last assistant message. The same rows scored by ``perplexity`` give the loss training reports on
its held-out rows, so a benchmark set's perplexity and the job's are the same quantity.

Loaded models are kept per (version id, artifact path) for ``LM_CACHE_SIZE`` versions: the
playground and a review each call ``generate`` many times for the same one or two versions.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

LM_CACHE_SIZE = 2
MAX_NEW_TOKENS = 256
_lock = threading.Lock()
_cache: OrderedDict[tuple[int, str], tuple[Any, Any]] = OrderedDict()


class LanguageModelError(ValueError):
    """The version cannot be loaded as a language model (the message says why)."""


def _base_folder(version: Any, folder: Path) -> Path:
    import json

    from training.bundle import LM_ADAPTER_CONFIG
    from training.services import base_model_path_problem

    extra = (version.spec or {}).get("extra") or {}
    base = str(extra.get("base_model_path") or "")
    if not base:
        config = json.loads((folder / LM_ADAPTER_CONFIG).read_text())
        base = str(config.get("base_model_name_or_path") or "")
    problem = base_model_path_problem(base) if base else "the adapter names no base model"
    if problem or not Path(base).is_dir():
        raise LanguageModelError(f"base model {base or '(none)'} cannot be read: {problem}")
    return Path(base)


def load(version: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of a language-model ``version``, in eval mode on CPU."""
    from serving import artifacts
    from training.bundle import LM_ADAPTER_CONFIG, is_language_model

    if not is_language_model(str((version.spec or {}).get("template") or "")):
        raise LanguageModelError(f"{version} is not a language model")
    folder = Path(artifacts.resolve_artifact(version.artifact_path, attr="artifact_path"))
    key = (int(version.pk or 0), str(folder))
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (folder / LM_ADAPTER_CONFIG).is_file():
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(
            str(_base_folder(version, folder)), local_files_only=True, dtype=torch.float32
        )
        model = PeftModel.from_pretrained(base, str(folder), local_files_only=True)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=torch.float32
        )
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model.eval()
    if quantized(version):
        model = quantize_int8(model)
    with _lock:
        _cache[key] = (model, tokenizer)
        while len(_cache) > LM_CACHE_SIZE:
            _cache.popitem(last=False)
    return model, tokenizer


def quantized(version: Any) -> bool:
    """Whether ``version`` is a torch.ao int8 variant (``serving.quantization``)."""
    extra = (version.spec or {}).get("extra") or {}
    record = extra.get("quantization") if isinstance(extra, dict) else None
    return isinstance(record, dict) and record.get("method") == "torch_dynamic_int8"


def quantize_int8(model: Any) -> Any:
    """``model`` with its ``Linear`` layers in dynamic int8 (``torch.ao``): int8 weights,
    activations quantised per call, on CPU. A LoRA model is merged into its base first (a
    quantised base under a float adapter would not be the model that was measured)."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8).eval()


def prompt_of(row: dict[str, Any]) -> str:
    """The text a model continues for ``row``: everything before its (last) response."""
    from training.lm import segments

    pieces = segments(row)
    last = max((i for i, (_, counted) in enumerate(pieces) if counted), default=len(pieces))
    return "".join(text for text, _ in pieces[:last])


def reference_of(row: dict[str, Any]) -> str:
    """The response ``row`` expects (its output, or a chat's last assistant message)."""
    from training.lm import segments

    counted = [text for text, c in segments(row) if c]
    return counted[-1].strip() if counted else ""


def generate(version: Any, prompts: list[str], *, max_new_tokens: int = 64) -> list[str]:
    """Greedy continuations of ``prompts`` (up to ``max_new_tokens`` tokens each, stopping at
    the end-of-sequence token), decoded without special tokens."""
    import torch

    max_new_tokens = max(1, min(int(max_new_tokens), MAX_NEW_TOKENS))
    model, tokenizer = load(version)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    out: list[str] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            if ids.shape[1] == 0 and tokenizer.bos_token_id is not None:
                ids = torch.tensor([[tokenizer.bos_token_id]])
            made = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            out.append(tokenizer.decode(made[0, ids.shape[1] :], skip_special_tokens=True))
    return out


def perplexity(version: Any, rows: list[dict[str, Any]], *, max_length: int = 512) -> dict:
    """The mean token loss and perplexity of ``version`` on the responses of ``rows`` (training's
    own encoding and loss)."""
    from training.lm import encode, evaluate

    model, tokenizer = load(version)
    examples = encode(tokenizer, rows, max_length)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    import torch

    return evaluate(model, examples, pad_id=pad, device=torch.device("cpu"), rows=8)
