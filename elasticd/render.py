"""Human-readable text shared by the verbs' renderers; `--json` bypasses it."""

from __future__ import annotations

import json
import time
from typing import Any


def plain(result: dict[str, Any]) -> str:
    """Any reply: a steering verb's plan in one line, anything else as indented JSON."""
    if "plan" in result:
        plan = result["plan"]
        head = "dry run: " if result.get("dry_run") else ("accepted: " if result.get("accepted") else "")
        op_id = f" (op {result['op_id']})" if result.get("op_id") else ""
        return f"{head}{plan.get('summary', '')}{op_id}"
    return json.dumps({k: v for k, v in result.items() if k != "ok"}, indent=1)


def event(e: dict[str, Any]) -> str:
    """One job event on one line, as `events` prints it and `events --follow` streams it."""
    stamp = time.strftime("%H:%M:%S", time.localtime(float(e.get("ts", 0))))
    skip = {"seq", "ts", "kind", "node"}
    details = " ".join(f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
                       for k, v in e.items() if k not in skip)
    return f"{stamp} #{e.get('seq')} [{e.get('node')}] {e.get('kind')} {details}".rstrip()
