"""Every Python block of the README and the docs pages runs (#29): a block that raises (a missing import, a renamed
argument) fails here. Training is cut to two steps (the Trainer's length arguments are overridden) and
``lit_compute.tune`` only checks that the README's call binds to its signature, so the blocks run in seconds; everything
else is real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# each distinct block once; a block that only includes a file (``--8<--``) is that file, run by its own tests
BLOCKS = list(
    dict.fromkeys(
        block
        for page in PAGES
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
        if "--8<--" not in block
    )
)

PRELUDE = """
import inspect, sys, traceback
import lightning.pytorch as pl
_init = pl.Trainer.__init__

def _short(self, *args, **kwargs):
    kwargs.update(max_steps=2, max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                  logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                  accelerator="cpu", devices=1)
    _init(self, *args, **kwargs)

pl.Trainer.__init__ = _short
import lit_compute
import lit_compute.tuning as tuning

def _tune_call_binds(*args, **kwargs):
    inspect.signature(tuning.tune).bind(*args, **kwargs)
    return tuning.TuneResult(out=None, settings={"precision": "bf16-mixed"}, speedup=2.0, baseline_rate=1.0,
                             tuned_rate=2.0, unit="samples/s", table="", summary="", journal=None)

lit_compute.tune = _tune_call_binds
failed = []
for i, block in enumerate(BLOCKS):
    try:
        exec(compile(block, f"README python block {i + 1}", "exec"), {"__name__": "__main__"})
    except Exception:
        failed.append(f"block {i + 1}:\\n{block}\\n{traceback.format_exc()}")
print("FAILED BLOCKS:", len(failed))
print("\\n".join(failed))
"""


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.heavy  # CI runs it (make check); make test leaves it out
@pytest.mark.slow
def test_every_python_block_of_the_readme_runs(tmp_path):
    from .conftest import run_script

    result = run_script(tmp_path, f"BLOCKS = {BLOCKS!r}\n" + PRELUDE, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "FAILED BLOCKS: 0" in result.stdout, result.stdout[-6000:]
