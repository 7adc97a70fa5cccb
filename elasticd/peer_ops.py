"""Membership messages between node agents and the coordinator, dispatched by op."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from elasticd import steer, step_agreement
from elasticd.protocol import Envelope

if TYPE_CHECKING:
    from elasticd.daemon import Daemon

log = logging.getLogger("elasticd")


def handle_peer(d: Daemon, sender: str, env: Envelope) -> None:
    """Coordinator side: a node agent (remote, or this daemon's own) says something."""
    c, now, body = d.coordinator, time.time(), env.body
    assert c is not None
    try:
        if env.type in ("req", "rep") and env.op.startswith("ctl."):
            d.plane.on_forwarded(sender, env)
        elif env.op == "register":
            welcome = c.register({**body, "node_id": sender}, now)
            if sender == d.cfg.node_id:
                d.send_to_node(sender, "welcome", welcome)
            elif d.coord_mesh is not None:
                d.coord_mesh.welcome(sender, welcome)
            node = c.nodes.get(sender)
            if welcome["ok"] and node and c.round and c.pending is None and node.role != "active":
                d.send_to_node(sender, "round", {"round": None, "state": node.role,
                                                 "reason": f"node is {node.role}; the job is at its target size"})
        elif env.op == "announce":
            c.announce(sender, now)
        elif env.op == "hb":
            d.send_to_node(sender, "hb" if c.heartbeat(sender, body, now) else "unknown", {})
        elif env.op == "leave":
            c.remove(sender, "left", str(body.get("reason", f"node {sender} left")), now)
        elif env.op == "worker_failed":
            c.worker_failed(sender, body, now)
        elif env.op == "node_done":
            c.node_done(sender, body, now)
        elif env.op == "node_drained":
            steer.node_drained(c, sender, now)
        elif env.op == "round_progress":
            c.round_progress(sender, body)
        elif env.op == "first_step":
            c.first_step(sender, int(body["round"]), float(body["at"]))
        elif env.op == "step_report":
            step_agreement.answer(c, sender, body, now)
        elif env.op == "pong":
            c.pong(sender, now)
        elif env.op == "event":
            c.adopt({**body, "node": sender})
        else:
            log.warning("mesh: unknown op %r from %s dropped", env.op, sender)
    except Exception as exc:  # one frame, however odd, must never end the coordinator's mesh loop
        log.warning("mesh: malformed %r from %s dropped: %r", env.op, sender, exc)


def handle_coordinator_message(d: Daemon, env: Envelope) -> None:
    """Node side: the coordinator assigns a round, ends the job, probes, or relays an event."""
    body = env.body
    if not d.registered and env.op not in ("welcome", "job_end"):
        return  # a daemon not yet welcomed acts on nothing: it may be a refused duplicate of a live node
    if env.type == "rep" and env.op.startswith("ctl."):
        d.plane.on_forwarded_reply(env)
    elif env.op == "welcome":
        on_welcome(d, body)
    elif env.op == "round":
        d.spawn(d.node.apply_round(body))
    elif env.op == "job_end":
        state = str(body.get("state", "failed"))
        d.spawn(d.finish(state, str(body.get("reason", ""))))
    elif env.op == "go":
        d.node.go(int(body["round"]))
    elif env.op == "probe":
        d.to_coord("pong", {"round": body.get("round")})
    elif env.op == "unknown" and d.registered:
        log.warning("[%s] the coordinator no longer knows this node; stopping workers and re-registering",
                    d.cfg.node_id)
        d.registered = False
        d.spawn(rejoin(d))
    elif env.op == "event" and d.coordinator is None:
        d.events.adopt(body)
        d.publish_event(body)
    elif env.op == "step_query":
        d.to_coord("step_report", {"op_id": body.get("op_id"),
                                   **step_agreement.local_answer(d.node.rank_metrics, d.node.round_id)})
    elif env.op == "drain_workers":
        d.channel.request("drain", body)
    elif env.op == "checkpoint_workers":
        d.channel.request("checkpoint", body)
    elif env.op == "kill_worker":
        d.spawn(d.node.kill_worker(int(body["rank"])))


def on_welcome(d: Daemon, body: dict[str, Any]) -> None:
    if body.get("ok"):
        d.registered, d.duplicate_since = True, 0.0
        d.node.state = body.get("role", "active")
        return
    reason = str(body.get("reason", "registration refused"))
    now = time.time()
    # A daemon restarted right after a SIGKILL finds its old self still listed until it is declared
    # lost; keep trying that long before calling the node id a duplicate.
    if "already in job" in reason and now - (d.duplicate_since or now) < d.cfg.lost_after_s + 2:
        d.duplicate_since = d.duplicate_since or now
        return
    d.fail_start(reason)


async def rejoin(d: Daemon) -> None:
    await d.node.stop_workers()
    d.node.round_id = 0
    d.register()


def leave_job(d: Daemon, reason: str) -> None:
    """SIGTERM/SIGINT/HUP and the `leave` path: a member leaves; the coordinator's node ends the job."""
    if d.coordinator is not None:
        d.coordinator.end("stopped", f"{reason}; it is the coordinator, so the job ends "
                          "(no coordinator HA yet)", time.time())
        return
    d.to_coord("leave", {"reason": reason})
    d.spawn(d.finish("stopped", f"left the job: {reason}", 0))
