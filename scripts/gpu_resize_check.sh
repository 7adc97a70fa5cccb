#!/usr/bin/env bash
# In-place resizes on NCCL, on a GPU host: generations re-formed in one process, and a worker's crash healed.
# Usage: scripts/gpu_resize_check.sh [REPORT_DIR]   (PYTHON=... to pick the interpreter; default python3)
# 1. tests/shim/test_resize_generation.py's NCCL case: one rank per GPU (1 GPU: worlds of one; >= 3 GPUs: 2, 3, 2, 3),
#    each generation a new NCCL group in the same processes, state from the freshest rank, bitwise equal.
# 2. examples/train_shim.py under elasticd, one worker per GPU: SIGKILL of the highest rank; the job must heal in
#    place (a `resize` event; with >= 2 GPUs the other workers keep their PIDs) and go on to its last step.
# Exits non-zero at the first check that fails and says which; REPORT_DIR keeps the logs and JSON replies.
source "$(dirname "$0")/gpu_lib.sh" "$@"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
((GPUS > 0)) || fail "torch sees no GPU"

say "generations on NCCL (tests/shim/test_resize_generation.py)"
(cd "$ROOT" && "$PY" -m pytest -q -rs tests/shim/test_resize_generation.py -k nccl) 2>&1 | tee "$REPORT/generations.txt"
grep -q "1 passed" "$REPORT/generations.txt" || fail "the NCCL generation test did not pass"

say "train_shim.py on NCCL under elasticd: a worker SIGKILL heals in place"
"${E[@]}" start --standalone --node-id gpu0 --nproc-per-node "$GPUS" --max-restarts 3 \
  "$ROOT/examples/train_shim.py" --steps 600 --step-time 0.02 --ckpt-every 0 --ckpt-dir "$WORK/ckpt" \
  >"$REPORT/shim.log" 2>&1 &
DAEMON=$!
wait_for "$REPORT/shim.log" "step=40 " 180
"${E[@]}" workers --json >"$REPORT/workers-before.json"
"${E[@]}" kill-worker gpu0 $((GPUS - 1)) --force >"$REPORT/kill.txt" 2>&1 || { cat "$REPORT/kill.txt"; fail "kill-worker"; }
wait_for "$REPORT/shim.log" "\] resize generation=" 120
"${E[@]}" workers --json >"$REPORT/workers-after.json"
"$PY" - "$REPORT/workers-before.json" "$REPORT/workers-after.json" "$GPUS" <<'PYEOF'
import json, sys
before, after = (json.load(open(p))["nodes"]["gpu0"] for p in sys.argv[1:3])
gpus = int(sys.argv[3])
old = {w["pid"] for w in before if w["state"] == "running"}
new = {w["pid"] for w in after if w["state"] == "running"}
print("pids before", sorted(old), "after", sorted(new))
assert len(new) == gpus, "a rank is missing after the heal"
assert len(old & new) == gpus - 1, "the surviving workers did not keep their processes"
PYEOF
wait "$DAEMON" || { tail -40 "$REPORT/shim.log" >&2; fail "elasticd exited non-zero"; }
DAEMON=""
grep -q "step=600 " "$REPORT/shim.log" || fail "the job never reached its last step"
grep -q "CorruptCheckpoint\|Traceback" "$REPORT/shim.log" && fail "a traceback in the job's output"
say "all in-place GPU checks passed; logs in $REPORT"
