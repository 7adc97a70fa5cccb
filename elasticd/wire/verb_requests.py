"""Each control verb's request (docs/protocol.md §5): a record per verb, decoded once where the frame arrives."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticd.wire.protocol import ErrorCode, ProtocolError
from elasticd.wire.record import R, Record

GOODPUT_NODES = 20  # nodes in a `goodput` reply, the lowest goodput first, unless asked for more
MAX_EXACT = 2**53  # the largest whole number a JSON client in any language reads exactly (a log offset, a rank)


@dataclass(frozen=True, kw_only=True)
class VerbRequest(Record):
    """What every verb's request may carry: who sends it (`by` in `command_received`). Unknown fields are ignored."""

    client: str = "?"

    @classmethod
    def decode(cls: type[R], body: object, what: str = "", size: int | None = None) -> R:
        """As Record.decode; a refusal is `bad_argument`: the operator's to fix, the field named in the reason."""
        try:
            return super().decode(body, what, size)
        except ProtocolError as err:
            raise ProtocolError(ErrorCode.BAD_ARGUMENT, err.reason) from None


@dataclass(frozen=True, kw_only=True)
class SteeringRequest(VerbRequest):
    """A verb that changes the job: a dry run only says what it would do; `force` overrides an interlock (§5.1)."""

    dry_run: bool = False
    force: bool = False


@dataclass(frozen=True, kw_only=True)
class NodeRequest(SteeringRequest):
    """`drain`, `cordon`, `uncordon`: the node they act on."""

    node: str


@dataclass(frozen=True, kw_only=True)
class ScaleRequest(SteeringRequest):
    nodes: int  # the target node count; within 1..--nnodes max is the verb's check (it needs the job's config)


@dataclass(frozen=True, kw_only=True)
class KillWorkerRequest(SteeringRequest):
    node: str
    rank: int  # a global rank on that node in this round


@dataclass(frozen=True, kw_only=True)
class StatusRequest(VerbRequest):
    """A page of the node list, in join order (default: every node)."""

    nodes_offset: int = 0
    nodes_limit: int | None = None

    def inconsistency(self) -> str:
        if self.nodes_offset < 0 or (self.nodes_limit is not None and self.nodes_limit < 0):
            return "nodes_offset and nodes_limit must be 0 or more"
        return ""


@dataclass(frozen=True, kw_only=True)
class RanksRequest(VerbRequest):
    history: int = 20  # recent rounds, the current one included; ≤ 0: none


@dataclass(frozen=True, kw_only=True)
class WorkersRequest(VerbRequest):
    node: str = ""  # "": every alive node


@dataclass(frozen=True, kw_only=True)
class EventsRequest(VerbRequest):
    since_seq: int = 0
    since_ts: float = 0.0  # Unix s
    kinds: list[str] = field(default_factory=list)  # []: every kind
    limit: int = 500  # the newest this many; ≤ 0: all


@dataclass(frozen=True, kw_only=True)
class GoodputRequest(VerbRequest):
    nodes: int = GOODPUT_NODES  # -1: every node


@dataclass(frozen=True, kw_only=True)
class NodeQueryRequest(VerbRequest):
    """`stacks`, and the base of `logs`: answered by the node named, for one rank of it or every rank."""

    node: str
    rank: int | None = None

    def inconsistency(self) -> str:
        return _whole("rank", self.rank)


@dataclass(frozen=True, kw_only=True)
class LogsRequest(NodeQueryRequest):
    round: int | None = None  # None: the node's newest
    tail: int = 0  # the last lines, at most 1000 (the CLI asks for 20)
    since: int | None = None  # a byte offset from a previous reply: only lines written after it (one rank's)

    def inconsistency(self) -> str:
        for name, value in (("round", self.round), ("tail", self.tail), ("since", self.since)):
            if why := _whole(name, value):
                return why
        if self.since is not None and self.rank is None:
            return "'since' reads one rank's log: give 'rank' too"
        return super().inconsistency()


def _whole(name: str, value: int | None) -> str:
    if value is not None and not 0 <= value < MAX_EXACT:
        return f"field '{name}' must be a whole number ≥ 0"
    return ""
