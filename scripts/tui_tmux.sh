#!/usr/bin/env bash
# End-to-end look of elastic-tui: a 2-node ticker job, the console in tmux at 120x36, views, drain b with confirm.
# Usage: scripts/tui_tmux.sh [CAPTURE_FILE]   (default /tmp/tui-capture.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${1:-/tmp/tui-capture.txt}"
WORK="$(mktemp -d /tmp/tui-tmux.XXXXXX)"
SESSION="elastic-tui-$$"
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export ELASTICD_RUNTIME_DIR="$WORK/run" PYTHONUNBUFFERED=1
PIDS=()

cleanup() {
  tmux kill-session -t "$SESSION" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

for node in a b; do
  "$PY" -m elasticd.cli start --nnodes 1:2 --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$PORT" \
    --rdzv-id tmuxdemo --node-id "$node" --log-dir "$WORK/logs" --grace-period 3 \
    "$ROOT/tests/support/workers/ticker.py" --interval 0.2 >"$WORK/elasticd-$node.log" 2>&1 &
  PIDS+=("$!")
  sleep 0.5
done

wait_for() {  # wait_for PATTERN SECONDS: poll the pane until PATTERN shows
  local deadline=$((SECONDS + $2))
  until tmux capture-pane -p -t "$SESSION" | grep -q -- "$1"; do
    [ "$SECONDS" -lt "$deadline" ] || { echo "timed out waiting for: $1" >&2; tmux capture-pane -p -t "$SESSION" >&2; return 1; }
    sleep 0.2
  done
}

tmux new-session -d -s "$SESSION" -x 120 -y 36 \
  "cd '$ROOT' && ELASTICD_RUNTIME_DIR='$ELASTICD_RUNTIME_DIR' '$PY' -m tui.cli connect --job tmuxdemo"
wait_for "world 2" 40
wait_for "live" 20
{
  echo "=== nodes"; tmux capture-pane -p -t "$SESSION"
  for view in ranks events ckpt loss; do
    tmux send-keys -t "$SESSION" ":" && tmux send-keys -t "$SESSION" -l "$view" && tmux send-keys -t "$SESSION" Enter
    wait_for "view :$view" 10
    sleep 0.5
    echo "=== $view"; tmux capture-pane -p -t "$SESSION"
  done
  tmux send-keys -t "$SESSION" ":" && tmux send-keys -t "$SESSION" -l "nodes" && tmux send-keys -t "$SESSION" Enter
  wait_for "view :nodes" 10
  tmux send-keys -t "$SESSION" Down && sleep 0.3 && tmux send-keys -t "$SESSION" D
  wait_for "Effect:" 10
  echo "=== drain b: confirmation (Cancel focused)"; tmux capture-pane -p -t "$SESSION"
  tmux send-keys -t "$SESSION" Tab && sleep 0.2 && tmux send-keys -t "$SESSION" Enter
  wait_for "world 1" 40
  sleep 1
  echo "=== after drain b"; tmux capture-pane -p -t "$SESSION"
} >"$OUT"
tmux send-keys -t "$SESSION" q
echo "tui_tmux: captured $(grep -c '^===' "$OUT") screens to $OUT"
