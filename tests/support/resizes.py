"""In-place resizes under real daemons, as the resize, sharded and two-host tests check them: a first world, the
round that resized, and each node's kept worker PIDs."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

from support.harness import ROOT, DaemonProc, Job, cli, wait_for

BATCH = 16  # over every rank: 4 per rank at world 4
ARGS = ("--steps", "100000", "--ckpt-every", "0", "--step-time", "0.05", "--batch", str(BATCH), "--micro", "8")


def pids_of(job: Job, node: str) -> set[int]:
    return {w["pid"] for w in cli(job, "workers")["nodes"].get(node, []) if w["state"] == "running"}


def first_world(job: Job, node: str, script: Path, args: tuple[str, ...], world: int) -> set[int]:
    """Start the job's first node and wait until its first world trains: that node's worker pids."""
    job.start(node, script, *args)
    first = job.wait_event("round_started", lambda e: e["world_size"] == world)
    job.wait_event("first_step", since=first["seq"])
    wait_for(lambda: len(pids_of(job, node)) == job.nproc)
    return pids_of(job, node)


def resized(job: Job, world: int, since: int) -> dict:
    """The in-place round of that world size after `since`, once its `resize` event closed its timeline."""
    started = job.wait_event("round_started", lambda e: e["world_size"] == world, since=since)
    assert started["in_place"], started
    done = job.wait_event("resize", lambda e: e["round"] == started["round"], since=since)
    assert list(done["timeline"]) == ["detect", "agreed", "left", "group_ready", "synced", "first_step"]
    parts = done["parts"]  # where the stall went: the shim's rebuild and heal times, the rest from the timeline
    assert list(parts) == ["leave", "group", "rebuild", "state", "wait", "collect", "plan", "transfer", "restore",
                           "first_step", "other"], parts
    assert abs(sum(parts.values()) - done["stall_s"]) < 0.01 and done["stall_s"] > 0, done
    # Measured by every rank, not left at zero: the heal's own figure, to 0.1 ms (a world of one plans in less
    # than the millisecond its part is rounded to).
    assert parts["rebuild"] > 0 and done.get("heal", {}).get("plan_s", 0) > 0, done
    return started


def kept(job: Job, node: str, rnd: dict) -> tuple[set[int], set[int]]:
    """(every pid, the pids kept in place) of that node's workers in that round, from its `workers_started`."""
    ev = job.wait_event("workers_started", lambda e: e["node"] == node and e["round"] == rnd["round"],
                        since=rnd["seq"])
    return set(ev["pids"]), set(ev["kept"])


def changed(job: Job, world: int, act: Callable[[], object], node: str, pids: set[int]) -> dict:
    """Do `act`, then the in-place round of that world it brings, in which `node` kept `pids` (the same processes):
    that round's `resize` event."""
    mark = job.seq()
    act()
    rnd = resized(job, world, mark)
    assert kept(job, node, rnd)[1] == pids
    return job.wait_event("resize", lambda e: e["round"] == rnd["round"], since=mark)


def graceful_changes(job: Job, script: Path, args: tuple[str, ...],
                     change: Callable[[int, Callable[[], object]], object]) -> DaemonProc:
    """Node b joins, is drained, comes back on `scale 2`, leaves on SIGTERM and joins again, each change through
    `change(world, act)` (the test's own checks of that round); b's daemon after it joined again."""
    b = job.start("b", script, *args, wait=False)
    change(4, lambda: b.wait_line(r"elasticd \S+: node "))
    change(2, lambda: cli(job, "drain", "b"))
    change(4, lambda: cli(job, "scale", "2"))
    change(2, lambda: b.signal(signal.SIGTERM))
    assert b.wait_exit(30) == 0
    b = job.start("b", script, *args, wait=False)
    change(4, lambda: b.wait_line(r"elasticd \S+: node "))
    return b


FSDP = ROOT / "examples" / "train_fsdp.py"


def digests(path: Path) -> dict[int, dict[int, str]]:
    """step -> {round: digest of the whole state as the step after it began} from rank 0's log."""
    found: dict[int, dict[int, str]] = {}
    for line in path.read_text().splitlines():
        label, step, digest = line.split()
        if label != "final":
            found.setdefault(int(step), {})[int(label)] = digest
    return found


def finish(job: Job, tmp: Path, node: str, extra: int = 8) -> int:
    """End the job a few steps from now (examples/train_fsdp.py --steps-file) and wait for it; the last step."""
    now = max(digests(tmp / "digests.log"))
    (tmp / "stop").write_text(str(now + extra))
    assert job.daemon(node).wait_exit(60) == 0
    return now + extra
