"""Inside a SLURM step, `elasticd start train.py` takes from the step what torchrun users write by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elasticd.cli.main import build_parser
from elasticd.cli.scheduler import job_keys
from elasticd.cli.start import config_from_args
from elasticd.job.config import ConfigError
from elasticd.job.slurm import PORT_BASE, check_one_task_per_node, slurm_step

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

STEP = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[07-08,11]",
        "SLURM_JOB_NODELIST": "gpu[07-08,11-12]", "SLURMD_NODENAME": "gpu08", "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1(x3)", "SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "32",
        "SLURM_RESTART_COUNT": "2"}


def test_the_step_names_its_nodes_the_coordinators_node_and_a_port_of_the_job() -> None:
    step = slurm_step(STEP)
    assert step is not None
    assert step.nodes == ("gpu07", "gpu08", "gpu11")  # the step's list, not the allocation's
    assert not step.hosts_coordinator and step.rdzv_id == "slurm-4242-0" and step.port == PORT_BASE + 4242
    assert step.nproc == 4 and step.restart_count == 2
    assert slurm_step({**STEP, "SLURM_GPUS_ON_NODE": "", "SLURMD_NODENAME": "gpu07"}).nproc == 32  # type: ignore[union-attr]
    assert slurm_step({**STEP, "SLURMD_NODENAME": "gpu07"}).hosts_coordinator  # type: ignore[union-attr]
    assert slurm_step({k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"}) is None  # the batch script


@pytest.mark.parametrize(("env", "message"), [
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "srun --ntasks-per-node=1 elasticd start"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1,2"}, "runs 1,2 tasks per node"),
    ({"SLURM_STEP_NODELIST": "gpu[07-"}, "is not a SLURM hostlist"),
    ({"SLURMD_NODENAME": "login1"}, "does not name this node (SLURMD_NODENAME='login1')"),
])
def test_a_step_elasticd_cannot_run_in_is_refused_with_the_fix(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        slurm_step({**STEP, **env})


def test_one_task_per_node_in_any_of_slurms_spellings() -> None:
    for tasks in ("1", "1(x4)", "1(x2),1", " 1 , 1(x3)"):
        check_one_task_per_node(tasks)


@pytest.fixture(autouse=True)
def keys_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 2-node step makes the job's keys: here, not in the user's home."""
    monkeypatch.setenv("ELASTICD_SLURM_KEYS", str(tmp_path / "keys"))
    return tmp_path / "keys"


def start(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str):  # type: ignore[no-untyped-def]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return config_from_args(build_parser().parse_args(["start", *args, "-m", "train"]))[0]  # a module: no file


def test_no_flag_at_all_gives_the_job_from_the_step(monkeypatch: pytest.MonkeyPatch, keys_home: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = start(monkeypatch, {**STEP, "SLURM_STEP_NODELIST": "localhost,gpu08", "SLURMD_NODENAME": "localhost"})
    assert (cfg.rdzv_host, cfg.rdzv_port, cfg.job_id) == ("localhost", PORT_BASE + 4242, "slurm-4242-0")
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node, cfg.node_id) == (1, 2, 4, "localhost")
    assert cfg.host_coordinator and "SIGUSR1" in cfg.leave_signals
    keys = str(keys_home / "4242")
    assert cfg.scheduler == {"kind": "slurm", "job_id": "4242", "step_id": "0", "node": "localhost",
                             "restart_count": 2, "keys": keys, "keys_owner": True}
    assert cfg.keys_dir == keys and (keys_home / "4242" / "clients" / "owner.key_secret").exists()
    said = capsys.readouterr().err
    assert "SLURM job 4242 step 0 on 2 node(s), requeued 2x: rendezvous localhost:14242 (here)" in said
    member = start(monkeypatch, {**STEP, "SLURM_STEP_NODELIST": "localhost,gpu08"})  # gpu08: not the first
    assert not member.host_coordinator and member.node_id == "gpu08" and member.rdzv_host == "localhost"
    assert member.keys_dir == keys and not member.scheduler["keys_owner"]  # the same keys, read, not made


def test_a_member_without_the_jobs_keys_names_the_shared_filesystem(tmp_path: Path) -> None:
    step = slurm_step({**STEP, "SLURM_STEP_NODELIST": "gpu07,gpu08"})
    assert step is not None
    with pytest.raises(ConfigError, match="must be on a filesystem the nodes share; or pass --keys DIR"):
        job_keys(step, tmp_path, wait_s=0.3)


def test_what_the_user_gives_wins_and_min_colon_means_up_to_the_steps_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**STEP, "SLURM_STEP_NODELIST": "localhost,gpu08", "SLURMD_NODENAME": "localhost"}
    cfg = start(monkeypatch, env, "--nnodes", "2:", "--nproc-per-node", "1", "--node-id", "n2",
                "--rdzv-id", "mine", "--signals-to-handle", "SIGTERM")
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node, cfg.node_id, cfg.job_id) == (2, 2, 1, "n2", "mine")
    assert cfg.leave_signals == ("SIGTERM",)
    assert start(monkeypatch, env, "--nnodes", "1").max_nodes == 1  # the same as the default, but given
    monkeypatch.setenv("PET_NNODES", "2")
    assert start(monkeypatch, env).min_nodes == 2  # PET_* counts as given
    with pytest.raises(ConfigError, match=r"MIN must be 1\.\.2, the nodes of this SLURM step"):
        start(monkeypatch, env, "--nnodes", "3:")


def test_the_batch_script_itself_is_told_to_use_srun(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cfg = start(monkeypatch, {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu[1-2]"})
    assert cfg.rdzv_host == "127.0.0.1" and cfg.max_nodes == 1  # a plain single-node job, as before
    assert "batch script, not a step: start one elasticd per node with `srun" in capsys.readouterr().err
