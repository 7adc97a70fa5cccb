"""A real SLURM cluster on this machine: slurmctld and one slurmd per node, each node a network namespace of
tests/support/netlab.py with its own hostname and hosts file, one munged for all. Debian's slurmctld, slurmd,
slurm-client and munge, installed by the set-up when missing (root); without root the tests skip, and under CI=true
they fail.

Nodes are entered with nsenter and unshare, not `ip netns exec`: that remounts /sys and hides /sys/fs/cgroup,
which slurmd needs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from support.harness import free_port
from support.netlab import Lab
from support.system_deps import require_binary, unavailable

CONF = """ClusterName=lab
SlurmctldHost=ctl({ctl})
SlurmctldPort={port}
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={dir}/munge.sock,cred_expire=20
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
KillWait=10
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """`nodes` SLURM nodes (node1, node2...) and their controller; sbatch, scontrol and the rest as a user runs them."""

    def __init__(self, tmp: Path, nodes: int = 2) -> None:
        self.dir, self.count = tmp, nodes
        self.names = [f"node{i + 1}" for i in range(nodes)]
        self.lab = Lab(nodes)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "SLURM_CONF": str(tmp / "slurm.conf")}

    def __enter__(self) -> SlurmCluster:
        for binary, package in (("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("sbatch", "slurm-client"),
                                ("munged", "munge"), ("nsenter", "util-linux")):
            require_binary(binary, package)
        self.lab.__enter__()
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        d, lab = self.dir, self.lab
        for folder in ("state", "spool", "out"):
            (d / folder).mkdir(parents=True, exist_ok=True)
        ctl = f"{lab.subnet}.1"
        (d / "hosts").write_text("127.0.0.1 localhost\n" + f"{ctl} ctl\n"
                                 + "".join(f"{a} {n}\n" for a, n in zip(lab.addrs, self.names, strict=True)))
        nodes = "\n".join(f"NodeName={n} NodeAddr={a} CPUs=2 State=UNKNOWN"
                          for n, a in zip(self.names, lab.addrs, strict=True))
        (d / "slurm.conf").write_text(CONF.format(ctl=ctl, port=free_port(), dir=d, nodes=nodes))
        (d / "munge.key").write_bytes(os.urandom(1024))
        os.chmod(d / "munge.key", 0o400)
        subprocess.run(["munged", "--force", f"--key-file={d}/munge.key", f"--socket={d}/munge.sock",
                        f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"],
                       check=True, capture_output=True, timeout=30)
        self.daemon(None, "ctl", f"exec slurmctld -D -f {d}/slurm.conf")
        for i in range(self.count):
            self.start_node(i)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listed = self.run("sinfo", "-h", "-o", "%D %t", check=False).stdout.split()
            if listed == [str(self.count), "idle"]:
                return
            time.sleep(0.5)
        unavailable(f"the SLURM cluster did not come up in 60 s: sinfo says {listed}; "
                    f"{(d / 'slurmctld.log').read_text()[-1500:] if (d / 'slurmctld.log').exists() else ''}")

    def start_node(self, i: int) -> None:
        self.daemon(self.lab.names[i], self.names[i], f"exec slurmd -D -N {self.names[i]} -f {self.dir}/slurm.conf")

    def pids(self, i: int) -> list[int]:
        """Every process on node i (in its network namespace)."""
        listed = subprocess.run(["ip", "netns", "pids", self.lab.names[i]], capture_output=True, text=True).stdout
        return [int(pid) for pid in listed.split()]

    def kill_node(self, i: int) -> None:
        """Node i as a power cut: SIGKILL to everything in its namespace, slurmd and the job's processes alike."""
        for pid in self.pids(i):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def daemon(self, netns: str | None, hostname: str, command: str) -> None:
        """A SLURM daemon in its own UTS and mount namespace (its hostname, the cluster's hosts file)."""
        inner = f"hostname {hostname} && mount --bind {self.dir}/hosts /etc/hosts && {command}"
        enter = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        log = open(self.dir / f"{hostname}.out", "wb")  # noqa: SIM115 - the daemon writes it while it lives
        self.procs.append(subprocess.Popen([*enter, "unshare", "--uts", "--mount", "sh", "-c", inner],
                                           stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def run(self, *command: str, check: bool = True, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(command, capture_output=True, text=True, env={**self.env, **(env or {})},
                                timeout=60, cwd=cwd)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)}: exit {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
        out = self.run("sbatch", "--parsable", "--open-mode=append", "-o", f"{self.dir}/out/%j.out", *args,
                       env=env, cwd=cwd).stdout
        return out.strip().split(";")[0]

    def output(self, job: str) -> str:
        path = self.dir / "out" / f"{job}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields: JobState, ExitCode, Restarts..."""
        text = self.run("scontrol", "show", "job", job, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def __exit__(self, *_exc: object) -> None:
        self.run("scancel", "--full", "--user=root", check=False)
        for i in range(self.count):  # slurmstepd and the job's processes leave slurmd's process group
            self.kill_node(i)
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        pid = self.dir / "munged.pid"
        if pid.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid.read_text().strip()), signal.SIGTERM)
        self.lab.__exit__()
