"""A SLURM job step as `elasticd start` finds it: what the step's environment says of the job, read once, checked.

docs/launchers.md. Everything a user writes by hand for torchrun under SLURM comes from here instead: the job id
(the rendezvous id), the step's nodes (expanded by python-hostlist, never `scontrol`, often missing in
containers), the coordinator's node (the step's first, by SLURM's own node name, never by DNS), a port derived
from the job id (two jobs on one node do not collide), the node's GPUs or CPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import hostlist

from elasticd.job.config import ConfigError
from elasticd.wire.protocol import JsonObject

PORT_BASE, PORT_SPAN = 10000, 20000  # below Linux's ephemeral ports (32768+): a port per job id, modulo the span
_TASKS = re.compile(r"(\d+)(?:\(x\d+\))?")  # one group of SLURM's tasks-per-node list: 2, or 1(x4)


@dataclass(frozen=True)
class SlurmStep:
    """The facts of one SLURM step on one node, as `srun` set them."""

    job_id: str  # SLURM_JOB_ID: the same across a requeue
    step_id: str
    nodes: tuple[str, ...]  # the step's nodes, in SLURM's order
    node_name: str  # SLURMD_NODENAME: this node, as SLURM names it
    gpus: int  # SLURM_GPUS_ON_NODE (0: none)
    cpus: int  # SLURM_CPUS_ON_NODE
    restart_count: int  # SLURM_RESTART_COUNT: how often the job was requeued

    @property
    def rdzv_id(self) -> str:
        return f"slurm-{self.job_id}-{self.step_id}"

    @property
    def port(self) -> int:
        return PORT_BASE + int(self.job_id) % PORT_SPAN

    @property
    def hosts_coordinator(self) -> bool:
        return self.node_name == self.nodes[0]

    @property
    def nproc(self) -> int:
        return self.gpus or max(1, self.cpus)

    def public(self) -> JsonObject:
        """What `status` says of it: which job and step, and how often SLURM requeued the job."""
        return {"kind": "slurm", "job_id": self.job_id, "step_id": self.step_id, "node": self.node_name,
                "restart_count": self.restart_count}


def in_batch_script(env: Mapping[str, str]) -> bool:
    """A SLURM job's batch shell (or `salloc`'s): the job is known, no step was started."""
    return bool(env.get("SLURM_JOB_ID")) and not env.get("SLURM_STEP_ID")


def slurm_step(env: Mapping[str, str]) -> SlurmStep | None:
    """The step this process runs in, or None outside one; a step that cannot run elasticd is a ConfigError."""
    job_id, step_id = env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "")
    if not job_id or not step_id:
        return None
    check_one_task_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")
    listed = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        nodes = tuple(hostlist.expand_hostlist(listed))
    except hostlist.BadHostlist as err:
        raise ConfigError(f"SLURM_STEP_NODELIST {listed!r} is not a SLURM hostlist: {err}") from None
    name = env.get("SLURMD_NODENAME", "")
    if not nodes or name not in nodes:
        raise ConfigError(f"this SLURM step's node list {listed!r} does not name this node "
                          f"(SLURMD_NODENAME={name!r}): pass --rdzv-endpoint and --node-id yourself")
    if not job_id.isdigit():
        raise ConfigError(f"SLURM_JOB_ID must be a number, got {job_id!r}")
    return SlurmStep(job_id, step_id, nodes, name, gpus=_count(env, "SLURM_GPUS_ON_NODE"),
                     cpus=_count(env, "SLURM_CPUS_ON_NODE"), restart_count=_count(env, "SLURM_RESTART_COUNT"))


def check_one_task_per_node(tasks: str) -> None:
    """One elasticd per node supervises all of its workers: two tasks per node would be two daemons there."""
    counts = [_TASKS.fullmatch(group.strip()) for group in tasks.split(",")]
    if all(m is not None and m.group(1) == "1" for m in counts):
        return
    raise ConfigError(f"this SLURM step runs {tasks} tasks per node; elasticd is one task per node (it starts the "
                      "node's workers itself): run it as `srun --ntasks-per-node=1 elasticd start ...` and set "
                      "the workers per node with --nproc-per-node (default: the node's GPUs)")


def _count(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "").strip()
    first = text.split("(")[0].split(",")[0]  # SLURM_CPUS_ON_NODE is a number; be lenient with a list's form
    return int(first) if first.isdigit() else 0
