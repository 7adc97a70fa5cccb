"""A takeover's rebuild: the coordinator an elected daemon builds from what etcd holds of the job."""

from __future__ import annotations

from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.etcd.store import Snapshot
from elasticd.coordinator.membership import StoredJob
from elasticd.job.events import EventLog
from elasticd.wire.names import Cause, JobState, NodeStatus
from elasticd.wire.protocol import JsonObject

# After a takeover every member gets this long on top of the heartbeat rule to find the new coordinator.
TAKEOVER_GRACE_S = 3.0


def reset_events(events: EventLog, stored: list[JsonObject]) -> None:
    """The job's log as etcd holds it: a new coordinator numbers on from there, with no gap."""
    events.clear()
    for event in stored:
        events.adopt(event)


def job_record(c: Coordinator) -> JsonObject:
    return c.stored().encode()


def restore(c: Coordinator, snap: Snapshot, now: float) -> None:
    """Rebuild the coordinator from etcd; every live member gets a grace to find us; the dead are lost now."""
    c.restore(StoredJob.decode(snap.job, "etcd's state/job") if snap.job else None,
              snap.rounds[-1] if snap.rounds else None)
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
