#!/usr/bin/env bash
# Every GPU-only check in one run, for a borrowed NVIDIA machine without network access:
#
#   bash scripts/gpu_checks.sh        (from the repository root)
#
# Uses the machine's own python3 (or $PYTHON) with its torch and lightning, and this checkout on PYTHONPATH (nothing to
# build). Wheels placed in .whl/ (nvidia-dali-cuda120, jsonargparse, ...) are installed to /tmp/site first.
# Prints and saves under ${OUT:-gpu_checks_out}/: versions.txt, bench_gpu.txt (`lit-compute bench gpu`, one
# table; bench_gpu.md: its table, rewritten after each check, under the figure header, with the commit from git or
# $LIT_COMPUTE_COMMIT), memory_cuda.md/.txt (`lit-compute bench memory` on the demo's ResNet-18: the estimate against
# max_memory_allocated and max_memory_reserved) and pytest_gpu.txt (the cuda/multi_gpu-marked tests). Exits non-zero if anything failed.
# tune_gpu.md/.txt (a short `lit-compute tune` of configs/baseline.yaml on the GPU: its knobs' table), fit_rows.csv/.md/.txt
# (whatif's fit-set workloads measured here: rows for lit_compute/bench/whatif/published_gpu.csv's fit set).
# BENCH_TIMEOUT, MEMORY_TIMEOUT, TUNE_TIMEOUT, PYTEST_TIMEOUT and FIT_TIMEOUT (seconds) bound the parts.
set -uo pipefail
out=${OUT:-gpu_checks_out}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
"$py" - <<'PY' 2>&1 | tee "$out/versions.txt"
import sys

import lightning
import torch

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
try:
    import nvidia.dali as dali
    dali_version = dali.__version__
except ImportError:
    dali_version = "not installed"
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, lightning {lightning.__version__}, "
      f"DALI {dali_version}, {gpu}")
PY
status=0
# the parts in the order of what is still open: the checks (whatif on this GPU, #50 item 4), the fit rows (#50), the
# cuda-marked tests (NCCL on the stream, #50 item 5), then the memory estimate (#49) and the tune (#51): a device call
# is cut at 10 minutes, and what ran first has written its files under $out by then
timeout "${BENCH_TIMEOUT:-420}" "$py" -m lit_compute.cli bench gpu --markdown "$out/bench_gpu.md" 2>&1 | tee "$out/bench_gpu.txt" || status=1
# rows for whatif's fit set measured on this chip (#50): a generation the published fit rows lack gets fit rows of its
# own; published_gpu.csv's columns in fit_rows.csv
LIT_COMPUTE_FIT_ROWS="$out/fit_rows.csv" timeout "${FIT_TIMEOUT:-150}" "$py" -m lit_compute.cli bench gpu --only "fit rows" \
  --markdown "$out/fit_rows.md" 2>&1 | tee "$out/fit_rows.txt" || status=1
tests="tests/test_gpu.py tests/precision"
"$py" -c "import nvidia.dali" 2>/dev/null && tests="$tests tests/data/test_dali_datamodule.py"
# shellcheck disable=SC2086
timeout "${PYTEST_TIMEOUT:-240}" "$py" -m pytest -q -rA -s -p no:cacheprovider -m "cuda or multi_gpu" $tests 2>&1 | tee "$out/pytest_gpu.txt" || status=1
# the memory estimate on CUDA against max_memory_allocated and max_memory_reserved of real steps (#49)
timeout "${MEMORY_TIMEOUT:-150}" "$py" -m lit_compute.cli bench memory --only "ResNet-18" --markdown "$out/memory_cuda.md" 2>&1 | tee "$out/memory_cuda.txt" || status=1
# a short tune of the plain ResNet config on this GPU (#51 item 4): its table says what TF32, cuDNN's autotuner, bf16,
# channels-last and the fused optimizer did here, and why any knob could not apply
timeout "${TUNE_TIMEOUT:-140}" "$py" -m lit_compute.cli tune --config configs/baseline.yaml --budget "${TUNE_BUDGET:-100s}" \
  --knobs precision,tf32,cudnn_benchmark,channels_last,fused_optimizer --log-dir "$out/tune_logs" --fresh \
  --out "$out/baseline.gpu_tuned.yaml" --markdown "$out/tune_gpu.md" 2>&1 | tee "$out/tune_gpu.txt" || status=1
exit $status
