"""`--on-event`: the coordinator's daemon runs a command or posts to a webhook on the job events an operator names."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import urllib.request
from collections.abc import Mapping

from elasticd.job.config import AlertRule
from elasticd.wire.protocol import Json

log = logging.getLogger("elasticd")
ALERT_TIMEOUT_S = 30.0  # a command or a post that takes longer is stopped: the next event must not wait behind it


class Alerts:
    """One action at a time per rule: an event that finds its rule's last action still running is skipped (and
    said), so a storm of events never piles up processes."""

    def __init__(self, rules: tuple[AlertRule, ...], job_id: str) -> None:
        self.rules = rules
        self.job_id = job_id
        self.running: dict[int, asyncio.Task[None]] = {}  # rule index -> its action in flight
        self.skipped = 0

    def on_event(self, event: Mapping[str, Json]) -> None:
        if not self.rules:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # numbered outside the daemon's loop (a takeover's rebuild): nothing to run it on
            return
        for index, rule in enumerate(self.rules):
            if rule.kinds and event.get("kind") not in rule.kinds:
                continue
            busy = self.running.get(index)
            if busy is not None and not busy.done():
                self.skipped += 1
                log.warning("alert: %s for %s skipped: its last one still runs", rule.action, event.get("kind"))
                continue
            self.running[index] = loop.create_task(self.act(rule, event))

    async def act(self, rule: AlertRule, event: Mapping[str, Json]) -> None:
        body = json.dumps(event, default=str)
        try:
            if rule.webhook:
                status = await asyncio.wait_for(asyncio.to_thread(post, rule.action, body), ALERT_TIMEOUT_S)
                log.info("alert: posted %s to %s (HTTP %s)", event.get("kind"), rule.action, status)
            else:
                code = await self.run(rule.action, event, body)
                level = logging.INFO if code == 0 else logging.WARNING
                log.log(level, "alert: %r for %s exited %s", rule.action, event.get("kind"), code)
        except TimeoutError:
            log.warning("alert: %r for %s took over %.0fs and was stopped", rule.action, event.get("kind"),
                        ALERT_TIMEOUT_S)
        except Exception as exc:  # an alert that fails must never touch the job
            log.warning("alert: %r for %s failed: %s", rule.action, event.get("kind"), exc)

    async def run(self, command: str, event: Mapping[str, Json], body: str) -> int | None:
        env = {**os.environ, "ELASTICD_EVENT": body, "ELASTICD_EVENT_KIND": str(event.get("kind")),
               "ELASTICD_JOB_ID": self.job_id}
        proc = await asyncio.create_subprocess_shell(command, stdin=asyncio.subprocess.PIPE, env=env,
                                                     start_new_session=True)
        try:
            await asyncio.wait_for(proc.communicate(body.encode()), ALERT_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise
        return proc.returncode

    async def finish(self) -> None:
        """At the daemon's exit: the actions in flight (the job's end among them) get their time, then stop."""
        if self.running:
            await asyncio.wait(self.running.values(), timeout=ALERT_TIMEOUT_S)


def post(url: str, body: str) -> int:
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"},
                                     method="POST")
    with urllib.request.urlopen(request, timeout=ALERT_TIMEOUT_S) as reply:
        return int(reply.status)
