"""Workers bind gloo/NCCL to the interface their daemon advertises, unless the user named one."""

from __future__ import annotations

import json
from pathlib import Path

from support.harness import WORKERS, Job

from elasticd.job.runtime import SOCKET_IFNAME_VARS, interface_holding, socket_ifname_env

PRINT_ENV = WORKERS / "print_env.py"


def test_loopback_address_is_held_by_lo() -> None:
    assert interface_holding("127.0.0.1") == "lo"


def test_address_no_interface_holds_adds_nothing_and_says_why() -> None:
    assert interface_holding("192.0.2.77") is None  # TEST-NET-1: never assigned to a real host
    env, note = socket_ifname_env("192.0.2.77", {})
    assert env == {}
    assert "no interface here holds 192.0.2.77" in note


def test_every_var_names_the_interface() -> None:
    env, note = socket_ifname_env("127.0.0.1", {})
    assert env == dict.fromkeys(SOCKET_IFNAME_VARS, "lo")
    assert note == "workers use interface lo (127.0.0.1) for gloo/NCCL"


def test_user_set_vars_are_kept_and_named() -> None:
    env, note = socket_ifname_env("127.0.0.1", {"GLOO_SOCKET_IFNAME": "foo"})
    assert env == {"NCCL_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}
    assert note.endswith("; kept GLOO_SOCKET_IFNAME=foo from the environment")
    env, note = socket_ifname_env("127.0.0.1", dict.fromkeys(SOCKET_IFNAME_VARS, "foo"))
    assert env == {}
    assert "kept" not in note and "GLOO_SOCKET_IFNAME=foo" in note


def test_worker_of_a_real_daemon_gets_the_interface_and_user_values_win(tmp_path: Path) -> None:
    with Job(tmp_path, nnodes="1", nproc=1, extra=["--preload", "json"]) as job:
        for var in SOCKET_IFNAME_VARS:
            job.env.pop(var, None)  # the test's own environment must not decide the answer
        job.env["NCCL_SOCKET_IFNAME"] = "mine"
        daemon = job.start("a", PRINT_ENV, *SOCKET_IFNAME_VARS)
        env = json.loads(daemon.wait_line(r"\[a:0\] env=(.*)").group(1))
        assert env == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "mine", "TP_SOCKET_IFNAME": "lo"}
        assert daemon.wait_exit(30) == 0
        assert ("workers use interface lo (127.0.0.1) for gloo/NCCL; kept NCCL_SOCKET_IFNAME=mine from the "
                "environment") in daemon.output()
