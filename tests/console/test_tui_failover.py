"""elastic-tui on a member while its coordinator is SIGKILLed (--rdzv-backend etcd): it shows the new one."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.console import SIZE, until
from support.etcd_cluster import EtcdCluster, etcd_job, wait_event
from support.harness import TICKER
from support.system_deps import require_binary

from tui.app import ElasticApp
from tui.widgets.header import JobHeader

pytestmark = pytest.mark.asyncio


async def test_the_console_on_a_survivor_follows_the_takeover(tmp_path: Path) -> None:
    with (EtcdCluster(require_binary("etcd", "etcd-server"), tmp_path, size=1).start() as etcd,
          etcd_job(tmp_path, etcd, "1:2") as job):
        a = job.start("a", TICKER)
        job.start("b", TICKER)
        wait_event(job, "b", "round_started", lambda e: e["world_size"] == 2)
        app = ElasticApp({job.job_id: [job.daemons["b"].control]})
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model.job.coordinator == "a" and app.model.job.world_size == 2,
                        what="the job as it starts")
            epoch = app.model.job.epoch
            assert epoch > 0
            a.kill_with_workers()
            await until(pilot, lambda: app.model.job.coordinator == "b" and app.model.job.world_size == 1,
                        timeout=30, what="b coordinates the smaller world")
            assert app.model.job.epoch > epoch
            shown = f"coordinator b (epoch {app.model.job.epoch})"  # the header redraws on its own refresh
            await until(pilot, lambda: shown in str(app.query_one(JobHeader).render()), what="the header")
            await until(pilot, lambda: any(e.get("kind") == "coordinator_elected" and e.get("node") == "b"
                                           for e in app.model.events), what="the election in the event view")
