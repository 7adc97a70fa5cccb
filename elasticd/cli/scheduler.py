"""The flags a scheduler's environment answers: under SLURM, `srun elasticd start train.py` needs none of them.

A value given on the command line or in PET_* always wins; only what nobody gave (`Default`) is derived.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from elasticd.cli.torchrun_flags import Default
from elasticd.job.config import DEFAULT_LEAVE_SIGNALS, ConfigError
from elasticd.job.slurm import SlurmStep, in_batch_script, slurm_step

PREEMPTION_NOTICE = "SIGUSR1"  # SLURM's --signal=USR1@N: the node leaves gracefully before SIGTERM comes


def unset(value: object) -> bool:
    return isinstance(value, Default)


def apply_slurm(ns: argparse.Namespace, env: Mapping[str, str] = os.environ) -> tuple[SlurmStep | None, list[str]]:
    """Fill the flags nobody gave from the SLURM step this daemon runs in; the step, and what was derived."""
    step = slurm_step(env)
    if step is None:
        if in_batch_script(env) and unset(ns.rdzv_endpoint) and not ns.standalone:
            return None, ["this is SLURM job " + env["SLURM_JOB_ID"] + "'s batch script, not a step: start one "
                          "elasticd per node with `srun --ntasks-per-node=1 elasticd start ...` to use its nodes"]
        return None, []
    said = []
    if unset(ns.rdzv_id):
        ns.rdzv_id = step.rdzv_id
    if unset(ns.node_id):
        ns.node_id = step.node_name
    etcd = str(ns.rdzv_backend or "").startswith("etcd")
    if unset(ns.rdzv_endpoint) and not (ns.master_addr or ns.master_port or ns.standalone or etcd):
        ns.rdzv_endpoint = f"{step.nodes[0]}:{step.port}"
        if "is_host" not in str(ns.rdzv_conf):  # the coordinator's node is SLURM's first, by name, never by DNS
            ns.rdzv_conf = ",".join(filter(None, [str(ns.rdzv_conf), f"is_host={str(step.hosts_coordinator).lower()}"]))
        said.append(f"rendezvous {ns.rdzv_endpoint}" + (" (here)" if step.hosts_coordinator else ""))
    ns.nnodes = _nnodes(ns.nnodes, len(step.nodes))
    if unset(ns.nproc_per_node):
        ns.nproc_per_node = str(step.nproc)
    if unset(ns.signals_to_handle):
        ns.signals_to_handle = ",".join((*DEFAULT_LEAVE_SIGNALS, PREEMPTION_NOTICE))
    said += [f"--rdzv-id {ns.rdzv_id}", f"--nnodes {ns.nnodes}", f"--nproc-per-node {ns.nproc_per_node}",
             f"--node-id {ns.node_id}", f"leaves on {ns.signals_to_handle}"]
    restarts = f", requeued {step.restart_count}x" if step.restart_count else ""
    return step, [f"SLURM job {step.job_id} step {step.step_id} on {len(step.nodes)} node(s){restarts}: "
                  + "; ".join(said)]


def _nnodes(text: str, step_nodes: int) -> str:
    """Not given: any of the step's nodes (1:N), so the job survives one's loss; `MIN:` is MIN to all of them."""
    if unset(text):
        return f"1:{step_nodes}"
    if text.strip().endswith(":"):
        low = text.strip()[:-1]
        if not low.isdigit() or not 1 <= int(low) <= step_nodes:
            raise ConfigError(f"--nnodes {text!r}: MIN must be 1..{step_nodes}, the nodes of this SLURM step")
        return f"{low}:{step_nodes}"
    return text
