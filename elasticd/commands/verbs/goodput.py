"""`goodput`: the share of the job's time that trained, and where the rest went, over its life and the last hour."""

from typing import Literal

from elasticd.commands.port import JobPort
from elasticd.commands.verb import Arg, Command
from elasticd.wire.read_replies import GoodputReply
from elasticd.wire.verb_requests import GOODPUT_NODES, GoodputRequest

BUCKETS: tuple[Literal["training", "checkpoint", "redone", "waiting"], ...] = ("training", "checkpoint", "redone",
                                                                           "waiting")


def read(c: JobPort, request: GoodputRequest) -> GoodputReply:
    return c.goodput.report(c.clock(), request.nodes)


def render(result: GoodputReply) -> str:
    share = result.goodput
    lines = [f"goodput {share:.1%} of rank time trained" if share is not None else "goodput - (nothing yet)",
             f"redone steps {result.redone_steps}  wall {result.wall_s:.0f}s",
             f"{'':<22} {'LIFE':>10} {'LAST HOUR':>10}"]
    life, window = result.life, result.window
    for name in BUCKETS:
        lines.append(f"{name:<22} {life[name]:>9.1f}s {window[name]:>9.1f}s")
    for reason in sorted(set(life["recovery"]) | set(window["recovery"])):
        lines.append(f"{'recovery: ' + reason:<22} {life['recovery'].get(reason, 0.0):>9.1f}s "
                     f"{window['recovery'].get(reason, 0.0):>9.1f}s")
    lines.append(f"{'accounted':<22} {life['accounted_s']:>9.1f}s {window['accounted_s']:>9.1f}s")
    if result.nodes:
        lines += ["", f"{'NODE':<22} {'GOODPUT':>8} {'IN JOB':>9} {'IDLE':>8}  LOST"]
        for row in result.nodes:
            node_share = f"{row['goodput']:.1%}" if row["goodput"] is not None else "-"
            lost = "  ".join(f"{k.removeprefix('recovery.')} {v:.1f}s" for k, v in row["lost"].items())
            lines.append(f"{row['node']:<22} {node_share:>8} {row['seconds']:>8.1f}s {row['idle']:>7.1f}s  {lost}")
    return "\n".join(lines)


COMMANDS = [Command("goodput", "share of the job's time that trained; lost time by cause", GoodputRequest, order=55,
                    read=read, reply=GoodputReply, render=render,
                    args=(Arg("nodes", "this many nodes, the lowest goodput first (-1: every node)", type=int,
                              flags=("--nodes",), default=GOODPUT_NODES),))]
