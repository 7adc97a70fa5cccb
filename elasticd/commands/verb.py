"""A verb declared once: its arguments, its console keys, and how it reads or steers the job."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from elasticd.commands.port import JobPort, NodePort
from elasticd.commands.render import plain
from elasticd.wire.protocol import ErrorCode, ProtocolError, arg

Body = dict[str, Any]
Reader = Callable[[JobPort, Body], Body]
Planner = Callable[[JobPort, Body], Body]
Applier = Callable[[JobPort, Body, Body], Body]
NodeReader = Callable[[NodePort, Body], Awaitable[Body]]
Caller = Callable[..., Body]  # the CLI's client.call(op, **args)
Follower = Callable[[Caller, Body, Body], Iterator[str]]  # (call, request, first reply) -> lines to print


@dataclass(frozen=True)
class Arg:
    """One command-line argument of a verb, and the request field its value goes into."""

    name: str  # the argparse dest (an option's metavar is its upper case)
    help: str
    type: Callable[[str], Any] | None = str
    flags: tuple[str, ...] = ()  # an option's spellings, e.g. ("--follow", "-f"); none: a positional argument
    default: Any = None  # an option left at None is not sent
    action: str = "store"  # argparse's: "store_true" for a flag (type None), "append" for a repeatable option
    field: str = ""  # the request field; "" for `name`
    to_request: Callable[[Any], Any] | None = None  # the CLI value as the daemon wants it
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
class Command:
    """A control verb, declared once: the daemon runs it, the CLI parses and prints it, the console binds it.

    A verb that looks has `read`. A verb that steers has `plan` (its checks and interlocks, then what it
    would do; a dry run stops there) and `apply` (the change; its reply gets the plan added). A verb that looks at
    one node's own workers has `on_node`: any daemon takes it, and the node named in its `node` argument answers
    (daemon/node_queries.py). `follow` is what `--follow` prints after the first reply.
    """

    name: str
    summary: str  # `elasticd --help`
    order: int = 1000  # place in `elasticd --help` and in the unknown-op reason; a new verb goes last
    read: Reader | None = None
    plan: Planner | None = None
    apply: Applier | None = None
    on_node: NodeReader | None = None
    args: tuple[Arg, ...] = ()
    render: Callable[[Body], str] = plain
    console: tuple[ConsoleAction, ...] = ()
    follow: Follower | None = None

    def __post_init__(self) -> None:
        shape = (self.read is not None, self.plan is not None, self.apply is not None, self.on_node is not None)
        if shape not in ((True, False, False, False), (False, True, True, False), (False, False, False, True)):
            raise TypeError(f"verb {self.name}: give either read, or plan and apply, or on_node")

    @property
    def steer(self) -> bool:
        """It changes the job: refused for viewers and under --readonly; takes dry_run and force."""
        return self.plan is not None

    def run(self, c: JobPort, body: Body) -> Body:
        """A job-wide verb at the coordinator (an `on_node` verb is run by daemon/node_queries.py)."""
        if self.read is not None:
            return self.read(c, body)
        if self.on_node is not None:  # a routing mistake, never the coordinator's to answer
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"{self.name} is answered by the node it names, "
                                "not by the coordinator")
        assert self.plan is not None and self.apply is not None
        plan = self.plan(c, body)  # its checks and interlocks refuse a dry run as they would the real one
        if arg(body, "dry_run", bool, False):
            return {"ok": True, "dry_run": True, "plan": plan}
        return {**self.apply(c, body, plan), "plan": plan}


def forced(body: Body) -> bool:
    """The request's `force`: override an interlock."""
    return bool(arg(body, "force", bool, False))
