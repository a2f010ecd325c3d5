#!/usr/bin/env bash
# Fractions on a real card, enforced the way the node agent does it (scheduler/node/mps.py).
#
# Needs: an NVIDIA GPU with driver r615+ (MPS v3), Docker with the NVIDIA Container Toolkit, root, and a
# CUDA image with PyTorch (GPU_CHECK_IMAGE). Run from the repository root:
#
#     sudo bench/gpu_check.sh            # GPU_CHECK_SECONDS=20 GPU_CHECK_GPU=0 by default
#
# It runs, on one card:
#   1. alone: one container with the whole card (no MPS) runs the busy loop: the card's full rate;
#   2. the agent's own code starts the card's MPS daemon (EXCLUSIVE_PROCESS, a namespace per share) and
#      two 0.5-card containers, each mounted and configured exactly as container_spec makes them, each
#      grabbing device memory 256 MB at a time until refused, then running the same busy loop;
#   3. a third container that drops MPS (CUDA_MPS_PIPE_DIRECTORY pointed elsewhere) must get no context.
# Meanwhile nvidia-smi samples the card. Prints one JSON line: per container its memory cap and what it
# got, its rate against the card's rate alone; whether the bypass was refused; "errors" and "commit".
set -uo pipefail
cd "$(dirname "$0")/.."
IMAGE=${GPU_CHECK_IMAGE:-pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime}
SECONDS_BUSY=${GPU_CHECK_SECONDS:-20}
GPU=${GPU_CHECK_GPU:-0}
PY=${PY:-.venv/bin/python}
OUT=$(mktemp -d)
errors=0
export SECRET_KEY=${SECRET_KEY:-gpu-check-only-0123456789abcdef0123456789} GPU_SHARE_ENFORCE=mps
export MPS_DIR=${MPS_DIR:-/run/gpucloud/mps-check}

COMMIT=$(git rev-parse --short HEAD)
UUID=$(nvidia-smi -i "$GPU" --query-gpu=uuid --format=csv,noheader) ||
  { echo "{\"errors\": 1, \"error\": \"no NVIDIA GPU here (nvidia-smi failed)\", \"commit\": \"$COMMIT\"}"; exit 1; }
MEMORY_MB=$(nvidia-smi -i "$GPU" --query-gpu=memory.total --format=csv,noheader,nounits)
DRIVER=$(nvidia-smi -i "$GPU" --query-gpu=driver_version --format=csv,noheader)
MODEL=$(nvidia-smi -i "$GPU" --query-gpu=name --format=csv,noheader)

# The workload: grab memory until refused (reports MB), then matmuls for SECONDS_BUSY (reports iterations/s).
read -r -d '' WORK <<'EOF'
import json, sys, time, torch
grab, blocks = sys.argv[1] == "grab", []
if grab:
    while True:
        try:
            blocks.append(torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"))
        except RuntimeError:
            break
    grabbed = len(blocks) * 256
    blocks.clear(); torch.cuda.empty_cache()
else:
    grabbed = None
a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize(); start, n = time.time(), 0
while time.time() - start < float(sys.argv[2]):
    a @ b; n += 1
    if n % 20 == 0: torch.cuda.synchronize()
torch.cuda.synchronize()
print(json.dumps({"grabbed_mb": grabbed, "iters_per_s": n / (time.time() - start)}))
EOF

run_alone() {
  docker run --rm --gpus "device=$UUID" "$IMAGE" python -c "$WORK" busy "$SECONDS_BUSY" 2>"$OUT/alone.err" | tail -1
}

# Mounts and environment for one 0.5 share, from the agent's own container_spec pieces.
share_args() {
  "$PY" - "$UUID" "$MEMORY_MB" <<'EOF'
import sys, django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings"); django.setup()
from types import SimpleNamespace
from scheduler.node import mps
from scheduler.node.launcher import CardShare
uuid, memory = sys.argv[1], int(sys.argv[2])
volumes, env = mps.client_spec(SimpleNamespace(simulated=False), [CardShare(uuid, 500, memory // 2, memory)])
args = [f"-v={src}:{v['bind']}:{v['mode']}" for src, v in volumes.items()]
args += [f"-e={k}={v}" for k, v in env.items()]  # no CUDA_MPS_* limits in the environment: the server's hold
print("\n".join(args))
EOF
}

alone=$(run_alone) || errors=$((errors + 1))

"$PY" - "$UUID" "$MEMORY_MB" <<'EOF' || errors=$((errors + 1))
import sys, django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings"); django.setup()
from types import SimpleNamespace
from scheduler.node import mps
from scheduler.node.launcher import CardShare
uuid, memory = sys.argv[1], int(sys.argv[2])
mps.cards_prepare(SimpleNamespace(simulated=False), [CardShare(uuid, 500, memory // 2, memory)])
EOF
mapfile -t ARGS < <(share_args)

nvidia-smi -i "$GPU" --query-gpu=utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/smi.csv" &
SMI=$!
# GPU_CHECK_DOCKER_ARGS: extra options to try (e.g. --ipc=host); the agent itself adds none.
PIDS=()
for i in 1 2; do
  docker run --rm --gpus "device=$UUID" ${GPU_CHECK_DOCKER_ARGS:-} "${ARGS[@]}" "$IMAGE" \
    python -c "$WORK" grab "$SECONDS_BUSY" >"$OUT/share$i.json" 2>"$OUT/share$i.err" &
  PIDS+=($!)
done
wait "${PIDS[@]}"
kill "$SMI" 2>/dev/null

# The bypass: the same container, pointed away from its MPS namespace, on a card in EXCLUSIVE_PROCESS mode.
bypass_out=$(docker run --rm --gpus "device=$UUID" -e CUDA_MPS_PIPE_DIRECTORY=/nowhere "$IMAGE" \
  python -c "import torch; torch.zeros(1, device='cuda'); print('GOT-A-CONTEXT')" 2>&1)
bypass_refused=true
[[ "$bypass_out" == *GOT-A-CONTEXT* ]] && bypass_refused=false

GPU_CHECK_UUID=$UUID "$PY" - <<'EOF' || errors=$((errors + 1))
import sys, django, os
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings"); django.setup()
from scheduler.node import mps
mps.card_release(os.environ["GPU_CHECK_UUID"])
EOF

"$PY" - "$OUT" "$alone" "$MEMORY_MB" "$bypass_refused" "$errors" "$MODEL" "$DRIVER" <<'EOF'
import json, pathlib, subprocess, sys
out, alone, memory, bypass_refused, errors, model, driver = sys.argv[1:8]
out, memory, errors = pathlib.Path(out), int(memory), int(errors)
try:
    alone_rate = json.loads(alone)["iters_per_s"]
except (ValueError, KeyError):
    alone_rate, errors = None, errors + 1
cap_mb = memory * 500 // 1000
shares = []
for i in (1, 2):
    try:
        got = json.loads((out / f"share{i}.json").read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        errors += 1
        shares.append({"share": 0.5, "error": (out / f"share{i}.err").read_text()[-300:]})
        continue
    rate = got["iters_per_s"]
    shares.append({
        "share": 0.5, "memory_cap_mb": cap_mb, "memory_grabbed_mb": got["grabbed_mb"],
        "memory_within_cap": got["grabbed_mb"] <= cap_mb * 1.02,
        "iters_per_s": round(rate, 1), "rate_vs_alone": round(rate / alone_rate, 3) if alone_rate else None,
    })
samples = [line.split(",") for line in (out / "smi.csv").read_text().splitlines() if line.strip()]
utilization = [int(s[0]) for s in samples if s[0].strip().isdigit()]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
print(json.dumps({
    "card": model, "driver": driver, "memory_mb": memory, "alone_iters_per_s": alone_rate, "shares": shares,
    "card_util_peak_pct": max(utilization, default=None), "bypass_refused": bypass_refused == "true",
    "errors": errors + (bypass_refused != "true"), "commit": commit,
}))
EOF
rm -rf "$OUT"
