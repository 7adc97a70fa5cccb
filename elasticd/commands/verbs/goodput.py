"""`goodput`: the share of the job's time that trained, and where the rest went, over its life and the last hour."""

from typing import Any

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Command

BUCKETS = ("training", "checkpoint", "redone", "waiting")


def read(c: JobPort, args: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, **c.goodput.report(c.clock())}


def render(result: dict[str, Any]) -> str:
    share = result.get("goodput")
    lines = [f"goodput {share:.1%} of rank time trained" if isinstance(share, float) else "goodput - (nothing yet)",
             f"redone steps {result['redone_steps']}  wall {result['wall_s']:.0f}s",
             f"{'':<22} {'LIFE':>10} {'LAST HOUR':>10}"]
    life, window = result["life"], result["window"]
    for name in BUCKETS:
        lines.append(f"{name:<22} {life[name]:>9.1f}s {window[name]:>9.1f}s")
    for reason in sorted(set(life["recovery"]) | set(window["recovery"])):
        lines.append(f"{'recovery: ' + reason:<22} {life['recovery'].get(reason, 0.0):>9.1f}s "
                     f"{window['recovery'].get(reason, 0.0):>9.1f}s")
    lines.append(f"{'accounted':<22} {life['accounted_s']:>9.1f}s {window['accounted_s']:>9.1f}s")
    return "\n".join(lines)


COMMANDS = [Command("goodput", "share of the job's time that trained; lost time by cause", order=55, read=read,
                    render=render)]
