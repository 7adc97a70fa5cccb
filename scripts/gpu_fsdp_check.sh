#!/usr/bin/env bash
# Sharded jobs on NCCL, on a GPU host: the FSDP2 example through resizes and a crash, and the abort call.
# Usage: scripts/gpu_fsdp_check.sh [REPORT_DIR]   (PYTHON=... to pick the interpreter; default python3)
# 1. The abort on a live NCCL communicator (trainer_shim.generation.abort, what the daemon's abort signal calls)
#    returns, and the same process joins the next generation on a new prefix and runs a collective in it.
# 2. examples/train_fsdp.py under elasticd, one worker per GPU (NCCL needs a GPU per rank), --mesh fsdp with a
#    checkpoint every 20 steps: with >= 2 GPUs node b (its own GPUs) joins, is drained, joins again and is
#    SIGKILLed (its shards had no replica: the `resize` event's heal.fallback names the checkpoint); with 1 GPU
#    the worker is SIGKILLed and its replacement resumes from the checkpoint. The job must reach its last step.
# Exits non-zero at the first check that fails and says which; REPORT_DIR keeps the logs and JSON replies.
source "$(dirname "$0")/gpu_lib.sh" "$@"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
((GPUS > 0)) || fail "torch sees no GPU"

say "abort a live NCCL communicator, then join the next generation"
"$PY" - <<'PYEOF' 2>&1 | tee "$REPORT/abort.txt"
import time, torch, torch.distributed as dist
from trainer_shim.generation import Generation, abort, join, leave, open_store
server = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
addr = f"127.0.0.1:{server.port}"
store = open_store(addr, 30)
torch.cuda.set_device(0)
opened = join(Generation(1, 0, 1, addr, "gpu/g1"), "nccl", store, 10)
t = torch.ones(1 << 20, device="cuda")
dist.all_reduce(t); torch.cuda.synchronize()
start = time.perf_counter()
abort("nccl", opened)  # what the abort signal's thread runs
print(f"abort returned in {time.perf_counter() - start:.3f}s")
leave("nccl", True, opened)
opened = join(Generation(2, 0, 1, addr, "gpu/g2"), "nccl", store, 10)
dist.all_reduce(t); torch.cuda.synchronize()
print("next generation: allreduce ok", float(t[0]))
leave("nccl", False, opened)
PYEOF
grep -q "next generation: allreduce ok" "$REPORT/abort.txt" || fail "the process did not join a generation after the abort"

say "train_fsdp.py on NCCL under elasticd"
ARGS=("$ROOT/examples/train_fsdp.py" --steps 400 --step-time 0.02 --mesh fsdp --ckpt-every 20 --ckpt-dir "$WORK/ckpt")
if ((GPUS >= 2)); then
  HALF=$((GPUS / 2))
  A_GPUS=$(seq -s, 0 $((HALF - 1))); B_GPUS=$(seq -s, "$HALF" $((2 * HALF - 1)))
  CUDA_VISIBLE_DEVICES=$A_GPUS "${E[@]}" start --nnodes 1:2 --rdzv-endpoint 127.0.0.1:29700 --rdzv-id gpufsdp \
    --node-id a --nproc-per-node "$HALF" --max-restarts 3 "${ARGS[@]}" >"$REPORT/a.log" 2>&1 &
  DAEMON=$!
  wait_for "$REPORT/a.log" "step=30 " 240
  start_b() {
    CUDA_VISIBLE_DEVICES=$B_GPUS "${E[@]}" start --nnodes 1:2 --rdzv-endpoint 127.0.0.1:29700 --rdzv-id gpufsdp \
      --node-id b --nproc-per-node "$HALF" --max-restarts 3 "${ARGS[@]}" >>"$REPORT/b.log" 2>&1 &
    B=$!
  }
  start_b
  wait_for "$REPORT/a.log" "world_size=$((2 * HALF)) mesh" 240
  "${E[@]}" drain b --job gpufsdp >"$REPORT/drain.txt"
  wait_for "$REPORT/a.log" "world_size=$HALF mesh.*round=3" 120
  wait "$B" || true
  start_b
  wait_for "$REPORT/a.log" "world_size=$((2 * HALF)) mesh.*round=4" 240
  wait_for "$REPORT/a.log" "step=1[2-9][0-9] " 240
  pkill -KILL -P "$B" || true; kill -KILL "$B" || true
else
  "${E[@]}" start --standalone --node-id gpu0 --nproc-per-node 1 --max-restarts 3 "${ARGS[@]}" >"$REPORT/a.log" 2>&1 &
  DAEMON=$!
  wait_for "$REPORT/a.log" "step=50 " 240
  "${E[@]}" kill-worker gpu0 0 --force >"$REPORT/kill.txt" 2>&1 || { cat "$REPORT/kill.txt"; fail "kill-worker"; }
fi
wait "$DAEMON" || { tail -40 "$REPORT/a.log" >&2; fail "elasticd exited non-zero"; }
DAEMON=""
"${E[@]}" events --json >"$REPORT/events.json" 2>/dev/null || true
grep -q "step=400 " "$REPORT/a.log" || fail "the job never reached its last step"
grep -q "Traceback" "$REPORT/a.log" && fail "a traceback in the job's output"
say "all sharded GPU checks passed; logs in $REPORT"
