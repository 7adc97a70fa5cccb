"""A `round` message as a member reads it: its part in a round, or the word that it has none for now."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from elasticd.wire.names import NodeState


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no number here


@dataclass(frozen=True)
class RoundAssignment:
    """The coordinator's `round` (docs/protocol.md §9.2), its fields checked once.

    With a `round_id`, this node's part in that round: `state` is `running` for a node with ranks, else its role.
    Without one (`round: null`), the node has no round for now: `state` says why it waits (waiting, standby,
    cordoned) and `reason` in words. `body` is the message as sent: the workers' environment and the round's
    store read the rest of it.
    """

    round_id: int | None
    state: str
    reason: str = ""
    master_port: int = 0  # 0: none (a message without a round)
    ranks: list[int] = field(default_factory=list)
    world_size: int = 0
    in_place: bool = False  # this node's shim workers keep their processes into the round
    prewarm: bool = False  # a standby of an in-place job: its workers start now and wait, ready to join
    job_store_tunnel: str = ""  # with --keys: the job store, reached through this node's relay
    body: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> RoundAssignment:
        """Raises ValueError for a message that is no round assignment (a field missing or of the wrong type)."""
        round_id, port = body.get("round"), body.get("master_port")
        state: Any = str(body.get("state", NodeState.waiting))
        ranks: Any = []
        world_size: Any = 0
        if round_id is not None:
            state, ranks, world_size = body.get("state"), body.get("ranks"), body.get("world_size")
            if not (_is_int(round_id) and isinstance(state, str) and _is_int(world_size) and isinstance(ranks, list)
                    and all(_is_int(rank) for rank in ranks)):
                raise ValueError(f"not a round assignment: round {round_id!r}, state {state!r}, ranks {ranks!r}, "
                                 f"world_size {world_size!r}")
        return cls(round_id, state, str(body.get("reason", "")), port if _is_int(port) else 0, ranks, world_size,
                   bool(body.get("in_place")), bool(body.get("prewarm")), str(body.get("job_store_tunnel") or ""),
                   body)

    def with_store(self, store: str) -> RoundAssignment:
        """The same assignment, its job store reached at `store` (this node's end of the relay's tunnel)."""
        return dataclasses.replace(self, body={**self.body, "store": store})
