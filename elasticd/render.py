"""Human-readable text for CLI replies; `--json` bypasses it."""

from __future__ import annotations

import json
import time
from typing import Any


def render(op: str, result: dict[str, Any]) -> str:
    renderer = _RENDERERS.get(op)
    return renderer(result) if renderer else _plain(result)


def _plain(result: dict[str, Any]) -> str:
    if "plan" in result:
        plan = result["plan"]
        head = "dry run: " if result.get("dry_run") else ("accepted: " if result.get("accepted") else "")
        op_id = f" (op {result['op_id']})" if result.get("op_id") else ""
        return f"{head}{plan.get('summary', '')}{op_id}"
    return json.dumps({k: v for k, v in result.items() if k != "ok"}, indent=1)


def _status(s: dict[str, Any]) -> str:
    restarts = " ".join(f"{k}={v}" for k, v in s["restarts"].items())
    lines = [
        f"job {s['job_id']}  state {s['state']}  round {s['round']}  world {s['world_size']}  "
        f"nodes {s['min_nodes']}:{s['max_nodes']} target {s['target']}  coordinator {s['coordinator']}",
        f"restarts {restarts} (max failures {s['max_restarts']})",
    ]
    if s.get("reason"):
        lines.append(f"reason: {s['reason']}")
    if s.get("last_recovery"):
        lines.append("last recovery: " + "  ".join(f"{k} {v:.2f}s" for k, v in s["last_recovery"].items()))
    ranks = {e["node_id"]: e["ranks"] for e in s.get("rank_map", [])}
    lines.append(f"{'NODE':<12} {'HOST':<16} {'ROLE':<9} {'STATUS':<7} {'RANKS':<12} LAST SEEN")
    for n in s["nodes"]:
        lines.append(f"{n['node_id']:<12} {n['host']:<16} {n['role']:<9} {n['status']:<7} "
                     f"{','.join(map(str, ranks.get(n['node_id'], []))) or '-':<12} {n['last_seen_age_s']:.1f}s ago")
    return "\n".join(lines)


def _event(e: dict[str, Any]) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(float(e.get("ts", 0))))
    skip = {"seq", "ts", "kind", "node"}
    details = " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
                       for k, v in e.items() if k not in skip)
    return f"{stamp} #{e.get('seq')} [{e.get('node')}] {e.get('kind')} {details}".rstrip()


def _events(result: dict[str, Any]) -> str:
    return "\n".join(_event(e) for e in result["events"]) or "(no events)"


def _metrics(result: dict[str, Any]) -> str:
    lines = [f"{'NODE':<10} {'RANK':>4} {'STEP':>7} {'LOSS':>10} {'SAMPLES/S':>10} {'CKPT AGE':>9}"]
    for r in result["ranks"]:
        loss = f"{r['loss']:.4f}" if isinstance(r.get("loss"), int | float) else "-"
        age = f"{r['checkpoint_age_s']:.1f}s" if r.get("checkpoint_age_s") is not None else "-"
        lines.append(f"{r['node']:<10} {r['rank']!s:>4} {r['step']!s:>7} {loss:>10} {r.get('throughput') or '-'!s:>10} "
                     f"{age:>9}")
    return "\n".join(lines)


def _ranks(result: dict[str, Any]) -> str:
    lines = []
    for rnd in result["history"]:
        mapping = "  ".join(f"{m['node_id']}={','.join(map(str, m['ranks']))}" for m in rnd["members"])
        lines.append(f"round {rnd['round_id']:>3} world {rnd['world_size']:>3} cause {rnd['cause']:<10} {mapping}")
    return "\n".join(lines) or "(no rounds yet)"


_RENDERERS = {"status": _status, "events": _events, "event": _event, "metrics": _metrics, "ranks": _ranks}
