#!/usr/bin/env bash
# The CUDA paths on a GPU host: NCCL through a crash and restart, NVML per worker, Prometheus GPU gauges.
# Usage: scripts/gpu_check.sh [REPORT_DIR]   (PYTHON=... to pick the interpreter; default python3)
# Exits non-zero at the first check that fails and says which; REPORT_DIR keeps the logs and JSON replies.
source "$(dirname "$0")/gpu_lib.sh" "$@"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_job() {  # run_job NAME SCRIPT ARGS...: one node, one worker per GPU, metrics on a free port
  local name="$1"; shift
  METRICS_PORT="$(free_port)"
  "${E[@]}" start --standalone --node-id gpu0 --nproc-per-node "${NPROC:-gpu}" --max-restarts 3 \
    --metrics-port "$METRICS_PORT" "$@" >"$REPORT/$name.log" 2>&1 &
  DAEMON=$!
}

finish_job() {  # finish_job NAME: the daemon must end the job with exit 0
  local rc=0
  wait "$DAEMON" || rc=$?
  DAEMON=""
  ((rc == 0)) || { tail -40 "$REPORT/$1.log" >&2; fail "$1: elasticd exited $rc"; }
}

say "plain NCCL script: NVML per worker, Prometheus GPU gauges, a worker SIGKILL and the restart"
run_job plain "$ROOT/examples/train_plain.py" --steps 400 --step-time 0.02 --snapshot "$WORK/snap.pt"
wait_for "$REPORT/plain.log" "step=40 " 120
sleep 3  # NVML samples every few seconds: let one land
"${E[@]}" workers --json >"$REPORT/workers.json"
"$PY" - "$REPORT/workers.json" <<'EOF'
import json, sys
reply = json.load(open(sys.argv[1]))
gpus = [w.get("gpu") for ws in reply["nodes"].values() for w in ws if w.get("gpu")]
assert gpus, f"no worker has a gpu record: {reply}"
print("workers' GPUs:", gpus)
assert all(g.get("proc_mem_bytes", 0) > 0 for g in gpus), "a worker shows no GPU memory of its own"
EOF
"$PY" -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics').read().decode())" \
  >"$REPORT/metrics.txt"
grep -E '^elasticd_gpu_(utilization_ratio|process_memory_bytes)\{' "$REPORT/metrics.txt" || fail "no GPU gauges"
"${E[@]}" kill-worker gpu0 0 --force >"$REPORT/kill.txt" 2>&1 || { cat "$REPORT/kill.txt"; fail "kill-worker"; }
wait_for "$REPORT/plain.log" "Resuming training from snapshot" 120
finish_job plain
grep -q "step=400 " "$REPORT/plain.log" || fail "plain: the last step never came"
"$PY" -c "import torch; assert torch.load('$WORK/snap.pt')['STEPS_RUN'] == 400"

say "shim NCCL script: a forced checkpoint, a worker SIGKILL, resume from the shim's checkpoint"
run_job shim "$ROOT/examples/train_shim.py" --steps 300 --step-time 0.02 --ckpt-every 0 --ckpt-dir "$WORK/ckpt"
wait_for "$REPORT/shim.log" "step=30 " 120
"${E[@]}" checkpoint >"$REPORT/checkpoint.txt" 2>&1 || { cat "$REPORT/checkpoint.txt"; fail "checkpoint"; }
sleep 1
"${E[@]}" kill-worker gpu0 0 --force >>"$REPORT/kill.txt" 2>&1 || fail "kill-worker (shim)"
finish_job shim
ls "$WORK/ckpt" >"$REPORT/ckpts.txt"
[[ -s "$REPORT/ckpts.txt" ]] || fail "shim: no checkpoint was written"
say "all GPU checks passed; logs in $REPORT"
