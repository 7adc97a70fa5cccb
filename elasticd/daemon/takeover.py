"""A takeover's rebuild: the coordinator an elected daemon builds from what etcd holds of the job."""

from __future__ import annotations

from typing import Any

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.store import Snapshot
from elasticd.job.events import EventLog
from elasticd.wire.names import Cause, JobState, NodeStatus

# After a takeover every member gets this long on top of the heartbeat rule to find the new coordinator.
TAKEOVER_GRACE_S = 3.0


def reset_events(events: EventLog, stored: list[dict[str, Any]]) -> None:
    """The job's log as etcd holds it: a new coordinator numbers on from there, with no gap."""
    events.clear()
    for event in stored:
        events.adopt(event)


def job_record(c: Coordinator) -> dict[str, Any]:
    return {"target": c.target, "restarts": dict(c.restarts), "used_ports": sorted(c.used_ports),
            "state": c.state, "reason": c.reason, "join_seq": c.join_seq, "coordinator": c.cfg.node_id}


def restore(c: Coordinator, snap: Snapshot, now: float) -> None:
    """Rebuild the coordinator from etcd; every live member gets a grace to find us; the dead are lost now."""
    job = snap.job
    if job:
        c.target = int(job["target"])
        c.restarts = {Cause(k): int(v) for k, v in job["restarts"].items()}
        c.used_ports = set(job["used_ports"])
        c.join_seq = int(job["join_seq"])
        c.state, c.reason = JobState(job["state"]), str(job["reason"])
    c.round = snap.rounds[-1] if snap.rounds else None
    c.goodput.replay(c.events.query(limit=0))
    me = c.cfg.node_id
    c.relays.rebuild(c.alive())
    c.replace_relay(me, now)  # we coordinate now: a group we relayed for moves behind the next of its members
    c.relays.direct(me)
    if me in c.nodes:
        c.nodes[me].via = ""
    for node in c.alive():
        node.last_seen = now + TAKEOVER_GRACE_S
    for node in c.alive():
        if node.node_id != me and snap.alive.get(node.node_id) != node.instance:
            c.remove(node.node_id, NodeStatus.lost, f"node {node.node_id}'s etcd lease expired", now)
    rnd = c.round
    if rnd is not None and c.state == JobState.running and c.pending is None:
        if c.round_lost_a_member():
            gone = sorted(n for n in rnd.node_ids() if c.nodes[n].status != NodeStatus.alive)
            c.schedule(Cause.membership, f"node(s) {', '.join(gone)} gone (coordinator takeover)", now)
        elif "go" not in rnd.timeline:  # the last coordinator went before releasing its round: form it again
            c.schedule(Cause.membership, f"round {rnd.round_id} was forming at the takeover", now)
