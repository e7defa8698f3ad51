"""The device check for ``lm_lora`` (``bench/lm_cuda_check.py``) runs its whole job on the CPU,
small: one lent GPU machine must be able to run it as it is, first time."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_lm_device_check_runs_a_whole_lm_lora_job_and_reports_tokens_per_s(tmp_path):
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import lm_cuda_check
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    out = tmp_path / "lm.json"
    args = ["--device", "cpu", "--threads", "1", "--rows", "120", "--filler", "8"]
    args += ["--layers", "2", "--width", "64", "--rounds", "1", "--batch-size", "16"]
    assert lm_cuda_check.main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (only,) = report["rounds"]
    assert report["bf16"] is False and only["dtype"] == "float32"
    # 96 training rows (the fixed 20% held out), one epoch of 16-row steps
    assert only["steps"] == 6
    assert only["train_tokens"] > 96 * 8  # every row has at least its 8 filler words
    assert report["train_tokens_per_s"]["median"] == only["train_tokens_per_s"] > 0
    assert only["perplexity"] < only["base_perplexity"]
