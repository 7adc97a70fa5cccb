# Shared by the GPU checks (scripts/gpu_check.sh, scripts/gpu_resize_check.sh): set-up, helpers, the host line.
# Source it with the report folder as $1: it sets ROOT, PY, REPORT, WORK, E (the elasticd CLI) and DAEMON.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
REPORT="${1:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
WORK="$(mktemp -d /tmp/gpu-work.XXXXXX)"
mkdir -p "$REPORT"
export ELASTICD_RUNTIME_DIR="$WORK/run" PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
E=("$PY" -m elasticd.cli)
DAEMON=""
cleanup() { [[ -n "$DAEMON" ]] && kill -TERM "$DAEMON" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
say() { echo "== $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
wait_for() {  # wait_for FILE REGEX SECONDS
  local deadline=$((SECONDS + $3))
  until grep -Eq "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || { tail -30 "$1" >&2; fail "no '$2' in $1 within $3 s"; }
    sleep 0.2
  done
}

say "host"
nvidia-smi -L | tee "$REPORT/gpus.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
  ".".join(map(str, torch.cuda.nccl.version())), "devices", torch.cuda.device_count())' | tee -a "$REPORT/gpus.txt"
