"""A question only one node can answer (`logs`, `stacks`): answered here, or carried to that node over the mesh.

A member asked about another node forwards the request to the coordinator as any verb (`ctl.<op>`); the
coordinator sends `node_query` to the node and relays its `node_answer` (docs/protocol.md, "Node queries").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from elasticd.commands.port import NodePort
from elasticd.commands.registry import REGISTRY
from elasticd.coordinator import inbox
from elasticd.wire.assignment import NodeQuery
from elasticd.wire.member_reports import NodeAnswer
from elasticd.wire.names import MeshOp, NodeStatus
from elasticd.wire.protocol import Envelope, ErrorCode, ProtocolError, new_id
from elasticd.wire.verb_requests import NodeQueryRequest

log = logging.getLogger("elasticd")
QUERY_TIMEOUT_S = 4.0  # under a forwarding member's own 5 s, so its client hears why
MAX_PENDING = 1000  # questions in flight at the coordinator; past that, refused (50 followers poll 4 times a second)
Answer = Callable[[dict[str, Any]], None]
Send = Callable[[str, MeshOp, dict[str, Any]], None]
NodeStatusOf = Callable[[str], NodeStatus | None]  # the coordinator's view of a node; None: unknown, or no coordinator


class NodeQueries:
    """Runs node queries on this node's workers, and, at the coordinator, routes them to the node they name."""

    def __init__(self, node_id: str, port: NodePort, send_to_node: Send, to_coord: Callable[[MeshOp, dict[str, Any]],
                 None], status_of: NodeStatusOf, is_coordinator: Callable[[], bool],
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self.node_id, self.port = node_id, port
        self.send_to_node, self.to_coord = send_to_node, to_coord
        self.status_of, self.is_coordinator, self.spawn = status_of, is_coordinator, spawn
        self.pending: dict[str, tuple[Answer, float, str]] = {}  # query id -> (answer, due, node)

    def ask(self, op: str, request: NodeQueryRequest, answer: Answer) -> bool:
        """Answer now or route to the node; False when this member must forward it to the coordinator first."""
        target = request.node
        if target == self.node_id:
            self.spawn(self.answer_here(op, request, answer))
            return True
        if not self.is_coordinator():
            return False
        status = self.status_of(target)
        if status is None:
            raise ProtocolError(ErrorCode.NOT_FOUND, f"no node '{target}' in this job")
        if status != NodeStatus.alive:
            raise ProtocolError(ErrorCode.NOT_RUNNING, f"node '{target}' is {status}: its daemon no longer answers "
                                "(its logs stay on its host, under --log-dir)")
        if len(self.pending) >= MAX_PENDING:
            raise ProtocolError(ErrorCode.REFUSED, f"{len(self.pending)} node queries in flight; try again shortly")
        qid = new_id()
        self.pending[qid] = (answer, time.time() + QUERY_TIMEOUT_S, target)
        self.send_to_node(target, MeshOp.node_query, {"id": qid, "op": op, "args": request.encode()})
        return True

    async def answer_here(self, op: str, request: NodeQueryRequest, answer: Answer) -> None:
        answer(await self.run(op, request))

    async def run(self, op: str, request: NodeQueryRequest | Mapping[str, object]) -> dict[str, Any]:
        """This node's answer to a request from its own control socket, or to a `node_query`'s args (decoded here)."""
        command = REGISTRY.get(op)
        if command is None or command.on_node is None:
            return ProtocolError(ErrorCode.UNKNOWN_OP, f"{op!r} is no node query").as_body()
        try:
            reply = await command.on_node(self.port, request if isinstance(request, NodeQueryRequest)
                                          else command.decode(request))
            return reply.encode()
        except ProtocolError as err:
            return err.as_body()
        except Exception as exc:  # a reader's bug must not take the daemon down
            log.exception("node query %s failed", op)
            return ProtocolError(ErrorCode.INTERNAL, f"{op} failed on node {self.node_id}: {exc!r}").as_body()

    # ---- the mesh's side ---------------------------------------------------------------------
    def on_query(self, query: NodeQuery) -> None:
        """Member side: the coordinator carries a question for us; the answer goes back the same way."""
        async def answer() -> None:
            self.to_coord(MeshOp.node_answer, {"id": query.id, "body": await self.run(query.op, query.args)})

        self.spawn(answer())

    def on_answer(self, sender: str, env: Envelope) -> None:
        """Coordinator side: a node answered; its asker hears it (a late answer finds nobody, and is dropped; a
        malformed one is said in a warning, and its asker hears of the node's silence in time)."""
        answer = inbox.decode(sender, env)
        entry = self.pending.pop(answer.id, None) if isinstance(answer, NodeAnswer) else None
        if isinstance(answer, NodeAnswer) and entry is not None:
            entry[0](answer.body)

    def expire(self, now: float) -> None:
        """Questions past their time, or to a node that has since left or been lost, are answered with why."""
        for qid, (answer, due, node) in list(self.pending.items()):
            status = self.status_of(node)
            if status is not None and status != NodeStatus.alive:
                del self.pending[qid]
                answer(ProtocolError(ErrorCode.NOT_RUNNING, f"node '{node}' {status} before it answered "
                                     "(its logs stay on its host, under --log-dir)").as_body())
            elif now > due:
                del self.pending[qid]
                answer(ProtocolError(ErrorCode.TIMEOUT, f"node {node} did not answer within "
                                     f"{QUERY_TIMEOUT_S:.0f} s").as_body())
