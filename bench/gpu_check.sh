#!/usr/bin/env bash
# Fractions and GPU numbers on a real NVIDIA card, checked with the node agent's own code (bench/gpu_check.py
# says every step). Needs root and an NVIDIA GPU; no Docker, no database. Run from anywhere:
#
#     sudo bench/gpu_check.sh          # GPU_CHECK_SECONDS=8 (each busy loop), GPU_CHECK_GPU=0, GPU_CHECK_NVML_S=30
#
# The Python that runs it needs PyTorch with CUDA and nvidia-ml-py (GPU_CHECK_PYTHON, else the first of
# python3 / .venv/bin/python that imports torch). One JSON line per step, then a summary with "errors".
# Restores the card's compute mode when it ends; never touches MIG or resets the card.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${GPU_CHECK_PYTHON:-}" ]]; then
  for candidate in python3 .venv/bin/python; do
    if "$candidate" -c 'import torch, pynvml, numpy' 2>/dev/null; then GPU_CHECK_PYTHON=$(command -v "$candidate"); break; fi
  done
fi
[[ -n "${GPU_CHECK_PYTHON:-}" ]] ||
  { echo '{"step": "summary", "errors": 1, "error": "no Python here imports torch, pynvml and numpy: set GPU_CHECK_PYTHON"}'; exit 1; }
[[ $EUID -eq 0 ]] || { echo '{"step": "summary", "errors": 1, "error": "run as root (compute mode, MPS daemon, namespaces)"}'; exit 1; }
export GPU_CHECK_PYTHON
exec timeout "${GPU_CHECK_TIMEOUT_S:-420}" "$GPU_CHECK_PYTHON" bench/gpu_check.py
