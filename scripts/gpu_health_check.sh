#!/usr/bin/env bash
# Node health's NVML checks on real hardware (docs/health.md): every call answers or says it is unsupported, a
# healthy GPU gives no reason, and a daemon reports the checks in `status`.
# Usage: scripts/gpu_health_check.sh [REPORT_DIR]   (PYTHON=... to pick the interpreter; default python3)
source "$(dirname "$0")/gpu_lib.sh" "$@"

say "NVML health calls, device by device (what answers, what is unsupported)"
"$PY" - <<'PYEOF' | tee "$REPORT/nvml_health.txt"
import pynvml
from elasticd.member.health_checks import NvmlHealth, UNCORRECTED, VOLATILE
health = NvmlHealth()
assert health.nvml is not None, "NVML did not start"
nvml = health.nvml
print("checks:", [str(c) for c in health.checks()], "xid events:", health.events is not None)
for index, handle in enumerate(health.handles):
    for name, call in [("ecc", lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, VOLATILE)),
                       ("retired pages pending", lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)),
                       ("remapped rows", lambda: nvml.nvmlDeviceGetRemappedRows(handle)),
                       ("throttle reasons", lambda: hex((getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                                                         or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)(handle)))]:
        try:
            print(f"GPU {index} {name}: {call()}")
        except pynvml.NVMLError as exc:
            print(f"GPU {index} {name}: unsupported ({exc})")
findings = health.check()
print("findings:", [f"{f.check}: {f.reason}" for f in findings] or "none")
PYEOF

say "a daemon's status lists the NVML checks it runs"
"${E[@]}" start --standalone --node-id gpu0 --nproc-per-node 1 --health-interval 1 \
  "$ROOT/examples/train_plain.py" --steps 400 --step-time 0.02 --snapshot "$WORK/snap.pt" >"$REPORT/daemon.log" 2>&1 &
DAEMON=$!
wait_for "$REPORT/daemon.log" "step=20 " 120
sleep 2
"${E[@]}" status --json >"$REPORT/status.json"
"$PY" - "$REPORT/status.json" <<'PYEOF'
import json, sys
node = json.load(open(sys.argv[1]))["nodes"][0]
print("checks:", node["checks"], "health:", node["health"] or "healthy")
assert "ecc" in node["checks"], "the daemon runs no NVML check"
PYEOF
say "GPU health checks answered; logs in $REPORT"
