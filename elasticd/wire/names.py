"""The job's vocabulary: ops, event kinds, the states of nodes, rounds and the job, and its store's key names.

Every name here crosses a process boundary (a mesh frame, an event, a JSON reply), so each is a `StrEnum`: it
compares equal to, and encodes as, its plain string. Members are spelled exactly as on the wire, so
`grep drain_workers` finds the definition, the sender and the receiver alike. docs/protocol.md lists them all,
docs/worker-channel.md the worker channel's. Stdlib only: trainer_shim imports it.

Vocabulary: a *node* is one host's elasticd; a *member* is a node seen from the coordinator; the
*coordinator* is the one node that decides; a *round* is one membership epoch with its rank map; a
*transition* is a graceful change (drain, scale down, stop, reform) that ends in a round or the job's end.
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        """`str` members that format as their value, as 3.11's enum.StrEnum does."""

        __str__ = str.__str__
        __format__ = str.__format__  # type: ignore[assignment]


class MeshOp(StrEnum):
    """Daemon-to-daemon messages (`docs/protocol.md`, "Mesh ops")."""

    # member -> coordinator
    announce = "announce"
    register = "register"
    hb = "hb"
    leave = "leave"
    event = "event"
    worker_failed = "worker_failed"
    node_done = "node_done"
    node_drained = "node_drained"
    round_progress = "round_progress"
    first_step = "first_step"
    step_report = "step_report"
    pong = "pong"
    resize_failed = "resize_failed"  # an in-place resize failed on that node: restart instead
    warm = "warm"  # a joiner's pre-started workers are up and wait for their generation
    node_answer = "node_answer"  # a node's answer to a `node_query`: {id, body}
    health = "health"  # the node's health verdict, on a change and each interval while unhealthy (docs/health.md)
    # coordinator -> member
    welcome = "welcome"
    unknown = "unknown"
    left = "left"
    round = "round"
    go = "go"
    job_end = "job_end"
    probe = "probe"
    step_query = "step_query"
    drain_workers = "drain_workers"
    checkpoint_workers = "checkpoint_workers"
    resize_workers = "resize_workers"  # shim ranks leave their group at the agreed step, keeping their process
    kill_worker = "kill_worker"
    relay = "relay"  # where the member sends from now on: its relay's endpoint, or "" for the coordinator
    node_query = "node_query"  # an operator's question only that node can answer (`logs`, `stacks`): {id, op, args}


class TunnelOp(StrEnum):
    """The store tunnel's frames (`docs/protocol.md` §9.3): one TCP connection to the round's store, relayed."""

    open = "open"
    data = "data"
    close = "close"


class WorkerOp(StrEnum):
    """The worker channel's frames (`docs/worker-channel.md`): a worker's reports, and the daemon's requests."""

    # worker -> daemon
    hello = "hello"
    step = "step"
    checkpoint = "checkpoint"  # a save completed (and, daemon -> worker, a request to save)
    checkpoint_skipped = "checkpoint_skipped"
    ack = "ack"
    drained = "drained"
    left = "left"  # it left its process group and waits for a generation
    joined = "joined"
    resize_failed = "resize_failed"
    # daemon -> worker
    drain = "drain"
    resize = "resize"  # leave the process group at the agreed step, keep the process
    generation = "generation"
    welcome = "welcome"  # the answer to a first hello that asks for one: `hold` while its round ends without it


STEP_WAIT_METRIC = "collective_wait_s"  # a shim rank's smoothed wait in the gradient allreduce, per step
PRESTART_ENV = "ELASTICD_AWAIT_GENERATION"  # a pre-started worker: RANK and WORLD_SIZE come with its generation
REHEARSE_ENV = "ELASTICD_REHEARSE_WORLD"  # a pre-started worker's expected world, which a sharded one rehearses
NEXT_WORLDS_ENV = "ELASTICD_REHEARSE_NEXT"  # a job's first workers: the worlds one change away, rehearsed at start
JOB_STORE_ENV = "ELASTICD_JOB_STORE"  # a pre-started worker: HOST:PORT/PREFIX, the job's store and its keys' prefix
CTL_PREFIX = "ctl."  # a member forwards an operator request as `ctl.<verb>`; the answer comes back as a `rep`


def generation_prefix(job: str, round_id: int) -> str:
    """A generation's keys in the job's store: under the job's own (`elastic/JOB/gROUND` of `elastic/JOB`)."""
    return f"{job}/g{round_id}"


def job_prefix(generation: str) -> str:
    """The job's own keys, above a generation's (`generation_prefix`): where a pre-started worker reads the state."""
    return generation.rpartition("/")[0] or generation


# A relay's batches (`docs/protocol.md` §9.5): the first part of a multipart message between a relay and the
# coordinator; JSON frames start with `{`, so neither can be taken for the other.
RELAY_UP = b"relay-up"  # relay -> coordinator: identity, frame, identity, frame... (an empty frame: that link closed)
RELAY_DOWN = b"relay-down"  # coordinator -> relay: identity, frame pairs, each frame for that member
RELAY_MANY = b"relay-many"  # coordinator -> relay: one frame, then every identity it goes to


class EventKind(StrEnum):
    """Job events: each is a numbered entry in the job's log, a PUB message on `ev.<node>.<kind>` and a log line."""

    # membership and rounds (coordinator)
    node_joined = "node_joined"
    node_left = "node_left"
    node_lost = "node_lost"
    node_role = "node_role"
    node_done = "node_done"
    waiting = "waiting"
    round_started = "round_started"
    round_complete = "round_complete"
    first_step = "first_step"
    straggler = "straggler"  # a node whose ranks make the others wait, persistently (coordinator/stragglers.py)
    straggler_cleared = "straggler_cleared"
    goodput = "goodput"  # a round's first step, the job's end: where its time went (coordinator/goodput.py)
    goodput_low = "goodput_low"  # goodput over --alert-goodput-window fell under --alert-goodput-below
    checkpoint_stale = "checkpoint_stale"  # the newest checkpoint is older than --alert-checkpoint-age
    stop_barrier_timeout = "stop_barrier_timeout"
    job_end = "job_end"
    relay_replaced = "relay_replaced"  # a relay went: its group now sends through another of its members
    # node health (coordinator/health.py, docs/health.md)
    node_unhealthy = "node_unhealthy"  # a node's checks failed, or it is a lemon: the reasons, and what was done
    node_healthy = "node_healthy"  # its checks pass again; it stays cordoned until `uncordon`
    # --rdzv-backend etcd (elasticd/daemon/failover.py)
    coordinator_elected = "coordinator_elected"
    etcd_unreachable = "etcd_unreachable"
    etcd_restored = "etcd_restored"
    # steering (coordinator)
    scale_set = "scale_set"
    checkpoint_requested = "checkpoint_requested"
    step_agreed = "step_agreed"
    interlock_refused = "interlock_refused"
    drain_started = "drain_started"
    drain_progress = "drain_progress"
    drain_complete = "drain_complete"
    drain_abandoned = "drain_abandoned"
    scale_started = "scale_started"
    scale_progress = "scale_progress"
    scale_complete = "scale_complete"
    scale_abandoned = "scale_abandoned"
    cordon_started = "cordon_started"
    cordon_progress = "cordon_progress"
    cordon_complete = "cordon_complete"
    cordon_abandoned = "cordon_abandoned"
    stop_started = "stop_started"
    stop_progress = "stop_progress"
    stop_complete = "stop_complete"
    stop_abandoned = "stop_abandoned"
    reform_started = "reform_started"
    reform_progress = "reform_progress"
    reform_complete = "reform_complete"
    reform_abandoned = "reform_abandoned"
    # in-place resizes (coordinator): the round kept its shim workers' processes
    resize = "resize"  # a generation formed in place: its timeline (agreed, left, group ready, synced, first step)
    resize_failed = "resize_failed"  # an in-place resize failed; a restart round follows, with the reason
    # a node's own (sent to the coordinator, which numbers them)
    workers_started = "workers_started"
    workers_stopped = "workers_stopped"
    worker_exited = "worker_exited"
    worker_failed = "worker_failed"  # a rank's failure, its error and whether it is the round's root cause
    worker_exit_timeout = "worker_exit_timeout"
    worker_killed = "worker_killed"
    worker_hung = "worker_hung"
    worker_left = "worker_left"  # a shim rank left its process group after a collective error (a peer died)
    worker_not_left = "worker_not_left"  # a kept rank did not leave its group in time: replaced, its stack taken first
    checkpoint_saved = "checkpoint_saved"
    checkpoint_skipped = "checkpoint_skipped"
    command_received = "command_received"
    unauthorized = "unauthorized"
    key_refused = "key_refused"  # a connection a keyed socket refused, at any stage of the handshake (rate-limited)
    unknown = "unknown"  # a member's event without a kind


class HealthCheck(StrEnum):
    """A named reason a node is unhealthy (member/health.py; docs/health.md)."""

    command = "command"  # --health-check CMD failed or timed out
    xid = "xid"  # an NVML critical XID event
    ecc = "ecc"  # uncorrectable ECC errors rose
    retired_pages = "retired_pages"  # pages pending retirement
    row_remap = "row_remap"  # a row remap failed
    throttle = "throttle"  # hardware slowdown, thermal or power-brake throttling
    nvml = "nvml"  # NVML itself did not answer within --health-timeout (a wedged driver)
    log_dir = "log_dir"  # the daemon's log folder is full or unwritable
    checkpoint_dir = "checkpoint_dir"  # the folder the node's ranks last saved to is full or unwritable
    lemon = "lemon"  # --lemon-failures root-cause failures within --lemon-window (the coordinator's verdict)


class Role(StrEnum):
    """Where the coordinator wants a node: in the world, waiting beside it, on its way out, or kept out."""

    active = "active"
    standby = "standby"
    draining = "draining"
    cordoned = "cordoned"


class NodeStatus(StrEnum):
    """Whether a node is still part of the job, as the coordinator sees it."""

    alive = "alive"
    lost = "lost"
    left = "left"


class NodeState(StrEnum):
    """What a node's own agent is doing now."""

    registering = "registering"
    active = "active"  # welcomed, before its first round
    running = "running"
    standby = "standby"
    waiting = "waiting"
    cordoned = "cordoned"
    draining = "draining"
    ending = "ending"


class JobState(StrEnum):
    """Where the job is: waiting for nodes, running, or ended (succeeded, failed, stopped)."""

    waiting = "waiting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"


ENDED = (JobState.succeeded, JobState.failed, JobState.stopped)


class Cause(StrEnum):
    """Why a round started; only `failure` counts against --max-restarts."""

    failure = "failure"
    membership = "membership"
    operator = "operator"
    hang = "hang"
    start = "start"  # the first round: nothing restarted


RESTART_CAUSES = (Cause.failure, Cause.membership, Cause.operator, Cause.hang)


class TransitionKind(StrEnum):
    """A graceful membership change: each has its own `<kind>_started` ... `<kind>_complete` events."""

    drain = "drain"
    scale = "scale"
    cordon = "cordon"
    stop = "stop"
    reform = "reform"  # healthy shim workers stop at one step before a round that restarts them (join, restart)


class After(StrEnum):
    """What follows once every rank has stopped: a new round, or the job's end."""

    round = "round"
    end = "end"


class StepRequest(StrEnum):
    """What the workers do at the agreed step (`step_agreed`'s `op`); each travels to the nodes as its own mesh op."""

    drain = "drain"
    checkpoint = "checkpoint"
    resize = "resize"  # leave the process group at the step, keep the process (an in-place drain)


OUTPUT = "output"  # the `source` of rank metrics read from output: no shim behind them (no drains, no hang checks)
