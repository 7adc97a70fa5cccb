"""deploy/kubernetes: rendered by kubectl (client side, no cluster here), and three pods played from the rendered
StatefulSet in the netns lab, each with the pod's name, address, environment and its service's DNS names:
world 3; one pod SIGTERMed → world 2 with 0 steps lost; that pod back under its name → world 3."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.harness import SHIM, DaemonProc, sample_lines, wait_for
from support.netlab import Lab
from support.system_deps import require_binary

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"


def rendered(folder: Path = DEPLOY) -> dict[str, dict[str, Any]]:
    """`kubectl kustomize deploy/kubernetes` (or another folder), by kind."""
    kubectl = require_binary("kubectl", "kubernetes-client")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=True)
    return {doc["kind"]: doc for doc in yaml.safe_load_all(out.stdout) if doc}


def container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return manifests["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]


def test_the_manifests_render_with_what_a_pod_needs() -> None:
    manifests = rendered()
    service, pods = manifests["Service"]["spec"], manifests["StatefulSet"]["spec"]
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert pods["serviceName"] == manifests["Service"]["metadata"]["name"]
    main = container(manifests)
    assert main["command"][:2] == ["elasticd", "start"]  # exec form: elasticd is PID 1 and gets the SIGTERM
    grace = float(main["command"][main["command"].index("--grace-period") + 1])
    assert pods["template"]["spec"]["terminationGracePeriodSeconds"] >= 2 * grace
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "elastic-0.elastic:29400" and env["ELASTICD_KEYS"] == "/etc/elasticd/keys"
    job = yaml.safe_load((DEPLOY / "pytorchjob.yaml").read_text())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["command"][:2] == ["elasticd", "start"] and "--insecure" not in worker["command"]


def test_the_etcd_tls_example_takes_its_certificates_and_password_from_secrets_and_elasticd_accepts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    overlay = DEPLOY.parent / "kubernetes-etcd-tls"
    manifests = rendered(overlay)
    main, spec = container(manifests), manifests["StatefulSet"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in main["env"]}
    conf = dict(part.split("=", 1) for part in env["PET_RDZV_CONF"].split(","))
    secrets = {v["name"] for v in spec["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    files = {k: conf[k] for k in ("cacert", "cert", "key", "password_file")}
    assert all(mounts.get(str(Path(path).parent)) in secrets for path in files.values()), (files, mounts)
    assert "password=" not in env["PET_RDZV_CONF"] + " ".join(main["command"])
    # elasticd reads it as the pod would, with the Secrets' files in place
    for key, path in files.items():
        local = tmp_path / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text("s3cret" if key == "password_file" else "PEM")
        env["PET_RDZV_CONF"] = env["PET_RDZV_CONF"].replace(f"{key}={path}", f"{key}={local}")
    for name, value in env.items():
        if name.startswith(("PET_", "ELASTICD_")) and value:
            monkeypatch.setenv(name, value.replace("$(POD_IP)", "127.0.0.1"))
    from elasticd.cli.main import build_parser
    from elasticd.cli.start import config_from_args

    command = [str(SHIM) if word == "train.py" else word for word in main["command"][2:]]
    cfg, _ = config_from_args(build_parser().parse_args(["start", *command]))
    assert cfg.etcd_access.describe() == "https, client certificate, user trainer" and len(cfg.etcd_endpoints) == 3


class Pods:
    """StatefulSet pods as the kubelet would run them, in the lab's namespaces: name, hosts, env, command."""

    def __init__(self, lab: Lab, tmp: Path, manifests: dict[str, dict[str, Any]]) -> None:
        self.lab, self.tmp, self.main = lab, tmp, container(manifests)
        self.names = [f"elastic-{i}" for i in range(len(lab.names))]
        (tmp / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{addr} {name}.elastic {name}\n" for addr, name in zip(lab.addrs, self.names, strict=True)))
        self.keys = tmp / "keys"
        for args in (["init"], ["create", "ops", "--role", "operator"]):
            subprocess.run([sys.executable, "-m", "elasticd.cli", "keys", "--dir", str(self.keys), *args],
                           check=True, capture_output=True, timeout=60)
        self.pods: dict[str, DaemonProc] = {}

    def start(self, i: int, *script_args: str) -> DaemonProc:
        env = {e["name"]: e.get("value", "") for e in self.main["env"]}
        env = {k: v.replace("$(POD_IP)", self.lab.addrs[i]) for k, v in env.items() if k != "POD_IP"}
        # The Secret's mount is a folder here; one worker per pod (`auto` is 2 here: 6 workers on 2 cores)
        env.update(ELASTICD_KEYS=str(self.keys), HOSTNAME=self.names[i], PET_NPROC_PER_NODE="1")
        command = [str(SHIM) if word == "train.py" else word for word in self.main["command"][2:]]
        command = [w for w in command if w not in ("--metrics-port", "9400")]  # one port per pod, not per machine
        pod = f"hostname {self.names[i]} && mount --bind {self.tmp}/hosts /etc/hosts && exec \"$@\""
        prefix = ["nsenter", f"--net=/run/netns/{self.lab.names[i]}", "unshare", "--uts", "--mount",
                  "sh", "-c", pod, "pod"]
        daemon = DaemonProc(["--log-dir", str(self.tmp / "logs"), *command, *script_args], self.tmp,
                            {**_base_env(), **env}, prefix)
        self.pods[self.names[i]] = daemon
        return daemon

    def close(self) -> None:
        for daemon in self.pods.values():
            if daemon.proc.poll() is None:
                daemon.kill_with_workers()


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PET_")}


def trains_on(samples: Path, steps: int) -> None:
    """Rank 0 trains `steps` more steps."""
    def done() -> int:
        return len(sample_lines(samples).get(0, [])) if samples.is_dir() else 0
    target = done() + steps
    wait_for(lambda: done() >= target, timeout=120)


@pytest.fixture()
def lab() -> Any:
    with Lab(3) as up:
        yield up


def test_three_pods_from_the_statefulset_lose_one_to_sigterm_and_take_it_back(lab: Lab, tmp_path: Path) -> None:
    pods = Pods(lab, tmp_path, rendered())
    samples = tmp_path / "samples"
    args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
            "--batch", "24", "--micro", "4", "--sample-log", str(samples))
    try:
        first = pods.start(0, *args)
        for i in (1, 2):
            pods.start(i, *args)
        first.wait_line(r"round_started .*world_size=3", timeout=180)
        trains_on(samples, 20)
        pods.pods["elastic-1"].proc.send_signal(signal.SIGTERM)  # the pod deleted: SIGTERM within its grace
        assert pods.pods["elastic-1"].wait_exit(60) == 0
        smaller = first.wait_line(r"round_started .*world_size=2", timeout=120)
        trains_on(samples, 20)
        pods.start(1, *args)  # the StatefulSet replaces it under the same name
        first.wait_line(r"round_started .*world_size=3", start=first.lines.index(smaller.string), timeout=180)
        trains_on(samples, 20)
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1))  # rank 0 over every world: 0 lost, 0 repeated
    finally:
        pods.close()
