"""Steering a live 2-node job through the `elasticd` CLI, as an operator would, with no --connect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.harness import TICKER, Job


def cli(job: Job, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "elasticd.cli", *args], env=job.env, capture_output=True,
                            text=True, timeout=30)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def job(tmp_path: Path):  # type: ignore[no-untyped-def]
    job = Job(tmp_path, nnodes="1:2", nproc=2)
    job.start("a", TICKER)
    job.start("b", TICKER)
    job.wait_event("round_started", lambda e: e["world_size"] == 4)
    yield job
    job.close()


def test_status_json_shows_both_nodes_rank_map_and_restarts(job: Job) -> None:
    status = json.loads(cli(job, "status", "--json").stdout)
    assert status["state"] == "running" and status["world_size"] == 4
    assert [n["node_id"] for n in status["nodes"]] == ["a", "b"]
    assert {e["node_id"]: e["ranks"] for e in status["rank_map"]} == {"a": [0, 1], "b": [2, 3]}
    # b joined a's running job (membership 1) or both formed the first round together (0): timing decides.
    assert status["restarts"]["membership"] in (0, 1)
    others = {k: v for k, v in status["restarts"].items() if k != "membership"}
    assert others == {"failure": 0, "operator": 0, "hang": 0}
    human = cli(job, "status").stdout
    assert "state running" in human and "b " in human
    hello = json.loads(cli(job, "status", "--json", "--connect", job.daemons["b"].control).stdout)
    assert hello["world_size"] == 4  # a member answers for the whole job


def test_drain_dry_run_then_drain_then_scale_back(job: Job) -> None:
    follow = subprocess.Popen([sys.executable, "-m", "elasticd.cli", "events", "--follow", "--json"],
                              env=job.env, stdout=subprocess.PIPE, text=True)
    try:
        plan = json.loads(cli(job, "drain", "b", "--dry-run", "--json").stdout)["plan"]
        assert plan["summary"] == "world 4 → 2; ranks 2-3 leave"
        assert job.status()["world_size"] == 4  # a dry run changes nothing
        mark = job.seq()
        assert "accepted" in cli(job, "drain", "b").stdout
        shrunk = job.wait_event("round_started", lambda e: e["world_size"] == 2, since=mark)
        status = job.status()
        assert {n["node_id"]: n["role"] for n in status["nodes"]} == {"a": "active", "b": "standby"}
        assert status["restarts"]["failure"] == 0
        assert "accepted" in cli(job, "scale", "2").stdout
        grown = job.wait_event("round_started", lambda e: e["world_size"] == 4, since=shrunk["seq"])
        assert grown["rank_map"] == {"a": [0, 1], "b": [2, 3]}
        seen = set()
        for line in follow.stdout:  # type: ignore[union-attr]
            seen.add(json.loads(line)["kind"])
            if json.loads(line)["seq"] >= grown["seq"]:
                break
        assert {"drain_started", "drain_complete", "round_started", "scale_set", "command_received"} <= seen
    finally:
        follow.kill()
        follow.wait(10)  # reaped: a test's zombie would be the next one's in the same process


def test_interlocks_refuse_with_a_reason_and_force_overrides(job: Job) -> None:
    refused = cli(job, "drain", "a", check=False)
    assert refused.returncode == 1
    assert "coordinator" in refused.stderr and "--force" in refused.stderr and "[refused]" in refused.stderr
    below = cli(job, "scale", "0", check=False)
    assert below.returncode == 1 and "within 1..2" in below.stderr
    job.wait_event("interlock_refused", lambda e: e["op"] == "drain")
    forced = json.loads(cli(job, "drain", "a", "--force", "--dry-run", "--json").stdout)
    assert forced["plan"]["world_after"] == 2


def test_cordon_keeps_a_node_out_until_uncordoned(job: Job) -> None:
    mark = job.seq()
    cli(job, "cordon", "b")
    job.wait_event("round_started", lambda e: e["world_size"] == 2, since=mark)
    assert {n["node_id"]: n["role"] for n in job.status()["nodes"]}["b"] == "cordoned"
    refused = cli(job, "scale", "2")  # a cordoned node is not a standby: nobody can join
    assert "only 0 standby node(s) available" in refused.stdout
    mark = job.seq()
    cli(job, "uncordon", "b")
    job.wait_event("round_started", lambda e: e["world_size"] == 4, since=mark)


def test_restart_and_kill_worker_are_counted_by_cause(job: Job) -> None:
    mark = job.seq()
    cli(job, "restart")
    job.wait_event("round_started", lambda e: e["cause"] == "operator", since=mark)
    mark = job.seq()
    cli(job, "kill-worker", "b", "3")
    job.wait_event("round_started", lambda e: e["cause"] == "failure", since=mark)
    status = job.status()
    assert status["restarts"]["operator"] == 1 and status["restarts"]["failure"] == 1
    per_node = {n["node_id"]: n["restarts"] for n in status["nodes"]}
    for node in ("a", "b"):  # each node's workers went through the restart and the kill
        assert per_node[node]["operator"] == 1 and per_node[node]["failure"] == 1 and per_node[node]["hang"] == 0
    missing = cli(job, "kill-worker", "b", "0", check=False)
    assert missing.returncode == 1 and "rank 0 is not on node 'b'" in missing.stderr


def test_stop_ends_the_job_on_every_node(job: Job) -> None:
    cli(job, "stop")
    assert job.daemons["a"].wait_exit(30) == 0
    assert job.daemons["b"].wait_exit(30) == 0
    none_left = cli(job, "status", check=False)
    assert none_left.returncode == 2 and "no running daemon found" in none_left.stderr


def test_python_client_typed_sync_and_async(job: Job) -> None:
    import asyncio

    from elasticd.client import AsyncClient, Client

    with Client(job.daemons["b"].control) as client:
        status = client.status()  # the reply's record, as the CLI decodes it
        assert status.world_size == 4 and {e["node_id"]: e["ranks"] for e in status.rank_map} == {"a": [0, 1],
                                                                                                "b": [2, 3]}
        assert [n["node_id"] for n in status.nodes] == ["a", "b"] and status.nodes[1]["role"] == "active"
        steered = client.steer("drain", node="b", dry_run=True)
        assert steered.dry_run and steered.plan is not None and steered.plan.summary == "world 4 → 2; ranks 2-3 leave"

    async def follow() -> tuple[int, list[str]]:
        client = AsyncClient(job.daemons["a"].control)
        try:
            status = await client.status()
            kinds = []
            async for event in client.events(job.daemons["a"].pub, idle_timeout_s=2.0):
                kinds.append(event.type)
                if event.type == "hb":
                    break
            return status.world_size, kinds
        finally:
            client.close()

    world, kinds = asyncio.run(follow())
    assert world == 4 and kinds[-1] == "hb"
