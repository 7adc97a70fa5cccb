"""The flags a scheduler's environment answers: under SLURM, `srun elasticd start train.py` needs none of them.

A value given on the command line or in PET_* always wins; only what nobody gave (`Default`) is derived.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from elasticd.cli.torchrun_flags import Default
from elasticd.job.config import DEFAULT_LEAVE_SIGNALS, ConfigError
from elasticd.job.slurm import SlurmStep, in_batch_script, slurm_step
from elasticd.keys.auth import KeyStore, KeyStoreError
from elasticd.wire.protocol import Json, JsonObject

PREEMPTION_NOTICE = "SIGUSR1"  # SLURM's --signal=USR1@N: the node leaves gracefully before SIGTERM comes
KEYS_WAIT_S = 60.0  # how long a node waits for the coordinator's node to write the job's keys (a shared filesystem)
OWNER = "owner"  # the operator key made with the job's keys: `elasticd status --key .../clients/owner.key_secret`


def slurm_keys_home() -> Path:
    """Where a SLURM job's own keys go: under the user's home, which a cluster's nodes share."""
    return Path(os.environ.get("ELASTICD_SLURM_KEYS") or Path.home() / ".config" / "elasticd" / "slurm")


def unset(value: object) -> bool:
    return isinstance(value, Default)


def apply_slurm(ns: argparse.Namespace, env: Mapping[str, str] = os.environ) -> tuple[JsonObject, list[str]]:
    """Fill the flags nobody gave from the SLURM step this daemon runs in; the step as `status` says it (with the
    keys made for the job), and what was derived."""
    step = slurm_step(env)
    if step is None:
        if in_batch_script(env) and unset(ns.rdzv_endpoint) and not ns.standalone:
            return {}, ["this is SLURM job " + env["SLURM_JOB_ID"] + "'s batch script, not a step: start one "
                          "elasticd per node with `srun --ntasks-per-node=1 elasticd start ...` to use its nodes"]
        return {}, []
    said, scheduler = [], step.public()
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
    if unset(ns.keys) and not ns.insecure and len(step.nodes) > 1:
        ns.keys = str(job_keys(step, slurm_keys_home()))
        scheduler.update(keys=ns.keys, keys_owner=step.hosts_coordinator)
        said.append(f"keys {ns.keys} (made for this job" + (", removed at its end)" if step.hosts_coordinator
                                                               else ")"))
    said += [f"--rdzv-id {ns.rdzv_id}", f"--nnodes {ns.nnodes}", f"--nproc-per-node {ns.nproc_per_node}",
             f"--node-id {ns.node_id}", f"leaves on {ns.signals_to_handle}"]
    restarts = f", requeued {step.restart_count}x" if step.restart_count else ""
    return scheduler, [f"SLURM job {step.job_id} step {step.step_id} on {len(step.nodes)} node(s){restarts}: "
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


def job_keys(step: SlurmStep, home: Path, wait_s: float = KEYS_WAIT_S) -> Path:
    """The job's own key store: written once by the coordinator's node (whole, by a rename), read by the others.

    Under the user's home (mode 0700), named by the job id, so a requeued job finds it again. docs/security.md.
    """
    root = home / step.job_id
    secret = root / "node" / "node.key_secret"
    if step.hosts_coordinator and not secret.exists():
        home.mkdir(parents=True, exist_ok=True)
        os.chmod(home, 0o700)
        staging = Path(tempfile.mkdtemp(prefix=f".{step.job_id}-", dir=home))
        try:
            store = KeyStore(staging)
            store.init()
            store.create_client(OWNER, "operator")
            staging.rename(root)
        except (OSError, KeyStoreError):  # a requeued run's store is already there: the nodes use that one
            shutil.rmtree(staging, ignore_errors=True)
    deadline = time.monotonic() + wait_s
    while not secret.exists():
        if time.monotonic() > deadline:
            raise ConfigError(f"no keys for SLURM job {step.job_id} in {root} after {wait_s:.0f}s: the coordinator's "
                              f"node ({step.nodes[0]}) writes them there, so {home} must be on a filesystem the "
                              "nodes share; or pass --keys DIR (elasticd keys init)")
        time.sleep(0.2)
    return root


def remove_job_keys(scheduler: Mapping[str, Json]) -> None:
    """At the coordinator's node's exit: the keys made for this job go with it."""
    if scheduler.get("keys_owner") and isinstance(scheduler.get("keys"), str):
        shutil.rmtree(str(scheduler["keys"]), ignore_errors=True)
