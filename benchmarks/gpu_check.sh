#!/usr/bin/env bash
# The device checks in one call, from the repository root on a machine with a CUDA GPU:
# the CUDA tests (the batched route against the CPU, no synchronisation inside a layer), the
# dispatch-mode proof of the batched route, then bench_gpu.py (about 8 minutes on an H100/H200).
#   bash benchmarks/gpu_check.sh [python]        (default: python)
set -euo pipefail
PY="${1:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU here'; print(torch.cuda.get_device_name())"
"$PY" -m pytest -q -p no:cacheprovider tests/core/engine/test_engines_cuda.py tests/core/engine/test_batched.py \
    tests/intervention/test_intervention_cuda.py tests/pipeline/test_analyze_cuda.py
cd benchmarks
"$PY" bench_gpu.py --device cuda --shapes smollm2,7b --seq-len 1024 --query-len 512
