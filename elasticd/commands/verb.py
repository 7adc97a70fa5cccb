"""A verb declared once: its request, its arguments, its console keys, and how it reads or steers the job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

from elasticd.commands.port import JobPort, NodePort
from elasticd.commands.render import plain
from elasticd.wire.protocol import ErrorCode, ProtocolError
from elasticd.wire.read_replies import Reply
from elasticd.wire.verb_replies import Plan, Steered
from elasticd.wire.verb_requests import NodeQueryRequest, SteeringRequest, VerbRequest

Body = dict[str, Any]  # a reply as JSON, as the daemon sends it and `--json` prints it
Q = TypeVar("Q", bound=VerbRequest)
Caller = Callable[..., Body]  # the CLI's client.call(op, **args)


@dataclass(frozen=True)
class Arg:
    """One command-line argument of a verb, and the request field its value goes into."""

    name: str  # the argparse dest (an option's metavar is its upper case)
    help: str
    type: Callable[[str], object] | None = str
    flags: tuple[str, ...] = ()  # an option's spellings, e.g. ("--follow", "-f"); none: a positional argument
    default: object = None  # an option left at None is not sent
    action: str = "store"  # argparse's: "store_true" for a flag (type None), "append" for a repeatable option
    field: str = ""  # the request field; "" for `name`
    to_request: Callable[[Any], object] | None = None  # the CLI value as the daemon wants it
    cli_only: bool = False  # the CLI itself acts on it (--follow); the daemon never sees it
    optional: bool = False  # a positional argument that may be left out


@dataclass(frozen=True)
class ConsoleAction:
    """A key in elastic-tui that sends the verb; plain strings, so elasticd never needs Textual."""

    id: str
    key: str  # a Textual key name: "c", "D", "plus"
    description: str
    targets: str = "job"  # "nodes" (marked or under the cursor), "rank" (under the cursor) or "job"
    destructive: bool = False  # confirmed in red


@dataclass(frozen=True)
class Command(Generic[Q]):
    """A control verb, declared once: the daemon runs it, the CLI parses and prints it, the console binds it.

    `request` is its request's record (elasticd/wire/verb_requests.py): the daemon decodes a body into it once,
    where the frame arrives, and every function below gets the record. A verb that looks has `read` and declares
    its `reply` (wire/read_replies.py): `read` and `on_node` return that record, the daemon encodes it, and the CLI
    decodes the body into it once, where it arrives, before `render` and `follow` get it. A verb that
    steers (its request a SteeringRequest) has `plan` (its checks and interlocks, then what it would do; a dry run
    stops there) and `apply` (the change; its reply gets the plan added). A verb that looks at one node's own
    workers has `on_node`: any daemon takes it, and the node named in its `node` argument answers
    (daemon/node_queries.py). `follow` is what `--follow` prints after the first reply.
    """

    name: str
    summary: str  # `elasticd --help`
    request: type[Q]
    order: int = 1000  # place in `elasticd --help` and in the unknown-op reason; a new verb goes last
    read: Callable[[JobPort, Q], Reply] | None = None
    plan: Callable[[JobPort, Q], Plan] | None = None
    apply: Callable[[JobPort, Q, Plan], Steered] | None = None
    on_node: Callable[[NodePort, Q], Awaitable[Reply]] | None = None
    reply: type[Reply] | None = None  # a verb that looks: its reply's record (a steering verb answers `Steered`)
    args: tuple[Arg, ...] = ()
    render: Callable[[Any], str] = plain  # gets the `reply` record (a steering verb's: the body)
    console: tuple[ConsoleAction, ...] = ()
    follow: Callable[[Caller, Q, Any], Iterator[str]] | None = None  # (call, request, first reply) -> lines

    def __post_init__(self) -> None:
        shape = (self.read is not None, self.plan is not None, self.apply is not None, self.on_node is not None)
        if shape not in ((True, False, False, False), (False, True, True, False), (False, False, False, True)):
            raise TypeError(f"verb {self.name}: give either read, or plan and apply, or on_node")
        if self.steer != issubclass(self.request, SteeringRequest):
            raise TypeError(f"verb {self.name}: a verb with plan and apply takes a SteeringRequest, no other does")
        if (self.on_node is not None) != issubclass(self.request, NodeQueryRequest):  # the daemon routes by it
            raise TypeError(f"verb {self.name}: an on_node verb takes a NodeQueryRequest (its node), no other does")
        if (self.reply is None) == (self.read is not None or self.on_node is not None):
            raise TypeError(f"verb {self.name}: a verb that looks declares its reply's record; a steering verb "
                            "answers `Steered`")
        # A request ignores fields it does not declare: an argument sent under another name would be lost silently.
        unknown = {a.field or a.name for a in self.args if not a.cli_only} - {f.name for f in fields(self.request)}
        if unknown:
            raise TypeError(f"verb {self.name}: {self.request.__name__} has no field {', '.join(sorted(unknown))}")

    @property
    def steer(self) -> bool:
        """It changes the job: refused for viewers and under --readonly; takes dry_run and force."""
        return self.plan is not None

    def decode(self, body: object, size: int | None = None) -> Q:
        """The request of a body, or ProtocolError(bad_argument) naming the field that is missing or mistyped."""
        return self.request.decode(body, self.name, size)

    def answer(self, body: Body) -> Any:
        """A reply body as `render` and `follow` take it: its record, decoded once (ProtocolError: bad_message)."""
        return self.reply.decode(body, f"{self.name} reply") if self.reply is not None else body

    def run(self, c: JobPort, request: Q) -> Body:
        """A job-wide verb at the coordinator (an `on_node` verb is run by daemon/node_queries.py)."""
        if self.read is not None:
            return self.read(c, request).encode()
        if self.on_node is not None:  # a routing mistake, never the coordinator's to answer
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{self.name} is answered by the node it names, "
                                "not by the coordinator")
        assert self.plan is not None and self.apply is not None
        plan = self.plan(c, request)  # its checks and interlocks refuse a dry run as they would the real one
        if not changes(request):
            return Steered(dry_run=True, plan=plan).encode()
        return replace(self.apply(c, request, plan), plan=plan).encode()


def changes(request: VerbRequest) -> bool:
    """A steering request for real, not a dry run: a coordinator that cannot keep a change refuses it."""
    return isinstance(request, SteeringRequest) and not request.dry_run
