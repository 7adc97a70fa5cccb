"""torchrun's whole command line and its PET_* variables under `elasticd start`; the flag list comes from torch."""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.harness import PLAIN, ROOT, TICKER
from torch.distributed.run import get_args_parser

from elasticd.cli.main import build_parser
from elasticd.cli.start import config_from_args
from elasticd.cli.torchrun_flags import torchrun_values
from elasticd.coordinator.coordinator import Coordinator
from elasticd.coordinator.membership import MemoryStore
from elasticd.job.config import JobConfig
from elasticd.job.events import EventLog
from elasticd.wire.member_state import Register

# A plausible value per torchrun dest, unlike torchrun's and our defaults; a flag torch adds later falls back
# to plausible_value's guess, so the test still asks our parser to accept it.
PLAUSIBLE = {
    "nnodes": "1:2", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:29401",
    "rdzv_id": "job7", "rdzv_conf": "join_timeout=5", "max_restarts": "3", "monitor_interval": "0.5",
    "start_method": "fork", "event_log_handler": "console", "role": "trainer", "log_dir": "/tmp/logs",
    "redirects": "3", "tee": "1", "local_ranks_filter": "0", "duplicate_stdout_filters": "a,b",
    "duplicate_stderr_filters": "a", "node_rank": "1", "master_addr": "127.0.0.2", "master_port": "29502",
    "local_addr": "127.0.0.3", "logs_specs": "spec", "numa_binding": "socket", "signals_to_handle": "SIGUSR1",
    "shutdown_timeout": "7",
}


def torchrun_actions() -> list[argparse.Action]:
    return [a for a in get_args_parser()._actions if a.option_strings and a.dest != "help"]


def plausible_value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.dest in PLAUSIBLE:
        return [PLAUSIBLE[action.dest]]
    return [str(action.choices[0])] if action.choices else ["1"]


def parse(*args: str) -> argparse.Namespace:
    return build_parser().parse_args(["start", *args])


@pytest.fixture(autouse=True)
def no_pet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PET_")]:
        monkeypatch.delenv(name)


EXITS = {"print_completion"}  # torchrun prints and exits as it parses these (torch 2.14); so does `elasticd start`


@pytest.mark.parametrize("action", torchrun_actions(), ids=lambda a: a.dest)
def test_every_torchrun_spelling_is_accepted(action: argparse.Action) -> None:
    baseline = parse(str(TICKER))
    torchrun_values(baseline)
    for spelling in action.option_strings:
        if action.dest in EXITS:
            with pytest.raises(SystemExit):  # the script, or the one line that says shtab is missing
                parse(spelling, *plausible_value(action))
            continue
        ns = parse(spelling, *plausible_value(action), str(TICKER))
        assert ns.script == str(TICKER), spelling  # the flag did not swallow the script
        torchrun_values(ns)
        assert getattr(ns, action.dest) != getattr(baseline, action.dest), spelling


@pytest.mark.parametrize("action", torchrun_actions(), ids=lambda a: a.dest)
def test_pet_variables_are_read_exactly_where_torchrun_reads_them(action: argparse.Action,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    baseline = parse(str(TICKER))
    torchrun_values(baseline)
    value = plausible_value(action)
    monkeypatch.setenv(f"PET_{action.dest.upper()}", value[0] if value else "1")
    from_env = parse(str(TICKER))
    torchrun_values(from_env)
    reads_pet = type(action).__name__ in ("env", "check_env")  # torch's argparse_util actions
    assert (getattr(from_env, action.dest) != getattr(baseline, action.dest)) == reads_pet


def test_pet_nproc_per_node_sets_the_worker_count_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "2")
    assert config_from_args(parse("--standalone", str(TICKER)))[0].nproc_per_node == 2
    assert config_from_args(parse("--standalone", "--nproc_per_node", "3", str(TICKER)))[0].nproc_per_node == 3


def test_static_form_maps_master_addr_and_port_to_the_coordinator_endpoint() -> None:
    cfg, _ = config_from_args(parse("--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.2",
                                    "--master_port", "29555", str(TICKER)))
    assert (cfg.rdzv_host, cfg.rdzv_port, cfg.node_rank) == ("127.0.0.2", 29555, 1)
    assert config_from_args(parse("--master-port", "29556", str(TICKER)))[0].rdzv_port == 29556
    cfg, _ = config_from_args(parse("--rdzv-endpoint", "127.0.0.1:29557", "--master-port", "29556", str(TICKER)))
    assert cfg.rdzv_port == 29557  # an explicit endpoint wins, as in torchrun


def test_rdzv_conf_maps_to_our_settings_and_our_own_flags_win() -> None:
    cfg, connect = config_from_args(parse("--rdzv-conf", "join_timeout=5, read_timeout=7,keep_alive_interval=2,"
                                          "keep_alive_max_attempt=4,is_host=1", "--shutdown-timeout", "9",
                                          str(TICKER)))
    assert (cfg.join_timeout_s, connect, cfg.heartbeat_s, cfg.heartbeat_misses, cfg.grace_s) == (5, 7, 2, 4, 9)
    cfg, _ = config_from_args(parse("--rdzv-conf", "join_timeout=5", "--join-timeout", "8", "--grace-period", "2",
                                    "--shutdown-timeout", "9", str(TICKER)))
    assert (cfg.join_timeout_s, cfg.grace_s) == (8, 2)


def test_console_role_and_signal_settings_reach_the_config() -> None:
    cfg, _ = config_from_args(parse("--nproc-per-node", "4", "-r", "0:3,1:3,2:1", "-t", "1:3", "--role", "critic",
                                    "--local-ranks-filter", "1,2,3", "--signals-to-handle", "TERM,SIGUSR1",
                                    str(TICKER)))
    assert cfg.console_ranks == frozenset({1, 3})  # 0 and 2 redirected (1 tee'd back), 0 filtered out too
    assert (cfg.role, cfg.leave_signals) == ("critic", ("SIGTERM", "SIGUSR1"))
    assert config_from_args(parse("--nproc-per-node", "2", "--tee", "3", str(TICKER)))[0].console_ranks is None


def test_node_rank_orders_the_rank_map_ahead_of_join_order() -> None:
    cfg = JobConfig(2, 3, 1, "127.0.0.1", 29400, "job", "a", ["train.py"])
    c = Coordinator(cfg, MemoryStore(), lambda n, op, b: None, EventLog(), lambda e: None)
    for node_id, node_rank in (("a", 1), ("c", -1), ("b", 0)):
        assert c.registration.register(node_id, Register(node_id, "127.0.0.1", 1, node_rank), time.time()).ok
    c.start_round("start", "test", time.time(), time.time())
    assert c.round is not None and c.round.node_ids() == ["b", "a", "c"]


# ---- through the real command line --------------------------------------------------------------------------
def start(tmp: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {"ELASTICD_RUNTIME_DIR": str(tmp / "run"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "elasticd.cli", "start", *args], cwd=tmp, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the daemon stops its workers on SIGTERM; what they printed says where they stood
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        logs = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(tmp.rglob("*.log")))
        raise AssertionError(f"elasticd start did not end within {timeout}s\nstdout:\n{out[-3000:]}\n"
                             f"stderr:\n{err[-3000:]}\nworker logs:\n{logs[-6000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


TICK = [str(TICKER), "--ticks", "2", "--interval", "0.01"]
FAST = ["--standalone", "--preload", "json", "--log-dir", "logs"]  # the fork path without importing torch


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--rdzv-conf", "bogus=1"], {}, "--rdzv-conf: unknown key 'bogus'; known: join_timeout"),
    (["--rdzv-conf", "join_timeout=soon"], {}, "join_timeout must be a positive number, got 'soon'"),
    (["--rdzv-conf", "join_timeout"], {}, "join_timeout needs a value"),
    (["--rdzv-endpoint", "localhost.invalid:29400", "--rdzv-conf", "is_host=1"], {}, "is not this host"),
    ([], {"PET_MAX_RESTARTS": "many"}, "--max-restarts (or PET_MAX_RESTARTS) must be an integer, got 'many'"),
    ([], {"PET_STANDALONE": "yes"}, "--standalone (or PET_STANDALONE) must be 0 or 1"),
    ([], {"PET_START_METHOD": "thread"}, "PET_START_METHOD must be one of spawn, fork, forkserver"),
    (["--redirects", "5"], {}, "--redirects must be 0..3 or LOCAL_RANK:0..3"),
    (["--tee", "0:x"], {}, "--tee must be 0..3"),
    (["--local-ranks-filter", "first"], {}, "--local-ranks-filter must be local ranks"),
    (["--signals-to-handle", "SIGKILL"], {}, "--signals-to-handle must be catchable signal names"),
    (["--master-port", "70000"], {}, "--master-port must be in 1..65535"),
    (["--shutdown-timeout", "0"], {}, "--shutdown-timeout must be positive"),
    (["--no-python", "-m"], {}, "--no-python and -m cannot go together"),
    (["--run-path", "--no-python"], {}, "--run-path runs a Python file"),
    (["--log-line-prefix-template", "${node}: "], {}, "--log-line-prefix-template: no macro ${node}"),
    ([], {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "cost $5 "}, "a lone $ in 'cost $5 '"),
])
def test_bad_torchrun_input_is_one_clear_line(tmp_path: Path, args: list[str], env: dict[str, str],
                                              message: str) -> None:
    result = start(tmp_path, *args, str(TICKER), env=env)
    assert (result.returncode, result.stderr.strip().count("\n")) == (2, 0), result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_no_python_execs_the_script_itself(tmp_path: Path) -> None:
    script = tmp_path / "work.sh"
    script.write_text('#!/bin/sh\necho "shell worker rank=$RANK role=$ROLE_NAME args=$*"\n')
    script.chmod(0o755)
    result = start(tmp_path, "--standalone", "--no-python", "--role", "loader", "--node-id", "n", "work.sh", "x")
    assert result.returncode == 0, result.stderr
    assert "[n:0] shell worker rank=0 role=loader args=x" in result.stdout
    assert result.stderr.count("--no-python: workers are exec'd directly") == 1


@pytest.mark.parametrize("how", ["flag", "env"])
def test_console_lines_take_torchruns_log_line_prefix_template(tmp_path: Path, how: str) -> None:
    """The flag is torch 2.14's; torch 2.13's torchrun reads the variable alone."""
    script = tmp_path / "say.sh"
    script.write_text('#!/bin/sh\necho "from $RANK"\n')
    script.chmod(0o755)
    template = "${hostname}|${role_name}${local_rank}|${rank}|$$ "
    flag = ["--log-line-prefix-template", template] if how == "flag" else []
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": template} if how == "env" else {}
    result = start(tmp_path, "--standalone", "--no-python", "--nproc-per-node", "2", "--role", "w", *flag,
                   "--log-dir", "logs", "say.sh", env=env)
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        assert f"{socket.gethostname()}|w{rank}|{rank}|$ from {rank}" in result.stdout.splitlines()
    assert all(log.read_text() == f"from {log.stem[-1]}\n" for log in (tmp_path / "logs").rglob("rank-*.log"))


def test_print_completion_writes_a_script_or_says_it_needs_shtab(tmp_path: Path) -> None:
    result = start(tmp_path, "--print-completion", "bash")  # no SCRIPT: it exits first, as torchrun's does
    if importlib.util.find_spec("shtab") is None:
        assert (result.returncode, result.stderr.strip(), result.stdout) == (
            2, "elasticd start: --print-completion needs the optional shtab package (pip install shtab)", "")
    else:
        assert result.returncode == 0 and "elasticd" in result.stdout and "--nproc-per-node" in result.stdout


def test_redirects_tee_and_filter_choose_the_console_ranks(tmp_path: Path) -> None:
    shown = start(tmp_path, *FAST, "--nproc-per-node", "3", "--node-id", "n", "-r", "3", "-t", "0:3,2:3",
                  "--local_ranks_filter", "0,1", "--monitor-interval", "1", *TICK)
    assert shown.returncode == 0, shown.stderr
    assert "[n:0] tick=1" in shown.stdout
    assert "[n:1]" not in shown.stdout and "[n:2]" not in shown.stdout  # 1 redirected, 2 filtered out
    logs = list((tmp_path / "logs").rglob("rank-*.log"))
    assert len(logs) == 3 and all("tick=1" in log.read_text() for log in logs)  # the log files get everything
    notes = [line for line in shown.stderr.splitlines() if "has no effect" in line]
    assert notes == ["elasticd start: --monitor-interval 1.0 has no effect: the daemon hears of a worker's exit "
                     "when it happens; it does not poll"]


def test_pet_nproc_per_node_really_starts_two_workers(tmp_path: Path) -> None:
    # --exit-timeout: a rank that hangs in gloo's teardown after its peer exited (seen once in a full run) is
    # stopped after 20 s, as torchrun's exit barrier would after its 300 s, and the job still ends well.
    result = start(tmp_path, "--standalone", "--log-dir", "logs", "--exit-timeout", "20", str(PLAIN), "--steps", "2",
                   "--step-time", "0", "--snapshot", str(tmp_path / "snap.pt"), env={"PET_NPROC_PER_NODE": "2"},
                   timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "world_size=2 rank=0" in result.stdout and "world_size=2 rank=1" in result.stdout
