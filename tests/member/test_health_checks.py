"""A node's own checks (member/health_checks.py): the site's command, NVML's counters through the stand-in, the log
folder. Each named reason, each bounded in time."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType

import pytest

from elasticd.job.config import JobConfig
from elasticd.member.health import HealthMonitor
from elasticd.member.health_checks import NvmlHealth, check_folder, run_command
from elasticd.wire.health import HealthFinding, HealthReport
from elasticd.wire.names import HealthCheck

STAND_IN = Path(__file__).resolve().parents[1] / "support" / "nvml_stand_in" / "pynvml.py"


def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, Path]:
    spec = importlib.util.spec_from_file_location("pynvml_stand_in", STAND_IN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"ecc": 2}))
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    return module, state


def test_nvml_errors_each_give_their_named_reason_and_the_grave_ones_stay(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    module, state = stand_in(tmp_path, monkeypatch)
    nvml = NvmlHealth(lambda: module)
    assert nvml.checks() == [HealthCheck.xid, HealthCheck.ecc, HealthCheck.retired_pages, HealthCheck.row_remap,
                             HealthCheck.throttle]
    assert nvml.check() == []  # two ECC errors from before we started are the baseline, not news
    state.write_text(json.dumps({"ecc": 5, "xids": [79], "pending_pages": True, "remap": [0, 1], "throttle": 0x48}))
    first = nvml.check()
    assert [f.check for f in first] == [HealthCheck.xid, HealthCheck.ecc, HealthCheck.retired_pages,
                                        HealthCheck.row_remap]  # throttling once is a spike, not yet a reason
    assert first[0].reason == "GPU 0: XID 79" and first[1].reason == "GPU 0: uncorrectable ECC errors 2 -> 5"
    assert nvml.check()[-1] == HealthFinding(HealthCheck.throttle, "GPU 0: HW_SLOWDOWN, HW_THERMAL_SLOWDOWN")
    state.write_text(json.dumps({"ecc": 5, "xids": [79]}))  # counters calm again: the XID and the ECC rise stay
    assert [f.check for f in nvml.check()] == [HealthCheck.xid, HealthCheck.ecc]


def test_without_nvml_there_is_nothing_to_check() -> None:
    def missing() -> ModuleType:
        raise ImportError("No module named 'pynvml'")
    nvml = NvmlHealth(missing)
    assert nvml.checks() == [] and nvml.check() == []


def test_a_command_fails_with_its_last_line_or_its_exit_and_is_killed_past_the_timeout() -> None:
    assert asyncio.run(run_command("echo fine", 5)) is None
    failed = asyncio.run(run_command("echo checking; echo 'nvme0: SMART critical warning' >&2; exit 3", 5))
    assert failed == HealthFinding(HealthCheck.command, "nvme0: SMART critical warning")
    assert asyncio.run(run_command("exit 4", 5)) == HealthFinding(HealthCheck.command, "failed (exit code 4)")
    started = time.monotonic()
    slow = asyncio.run(run_command("sleep 30 & sleep 30", 0.5))  # its child too: the whole group is killed
    assert slow == HealthFinding(HealthCheck.command, "timed out after 0.5s") and time.monotonic() - started < 5


def test_a_log_folder_that_cannot_be_written_is_a_reason(tmp_path: Path) -> None:
    assert check_folder(str(tmp_path / "logs")) is None
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    finding = check_folder(str(blocked / "logs"))
    assert finding is not None and finding.check == HealthCheck.log_dir and "is not writable" in finding.reason


def test_the_monitor_reports_every_interval_and_again_at_once_when_registered_anew(tmp_path: Path) -> None:
    cfg = JobConfig(1, 1, 1, "127.0.0.1", 29400, "job", "a", ["train.py"], log_dir=str(tmp_path),
                    health_command="exit 1", health_interval_s=5.0, health_timeout_s=5.0)
    sent: list[tuple[float, HealthReport]] = []
    registered = [False]
    # Where the ranks last saved: a folder no file can be made in (as root, /proc), and one pruned since.
    monitor = HealthMonitor(cfg, lambda r: sent.append((time.monotonic(), r)), lambda: registered[0],
                            lambda: ["/proc", str(tmp_path / "pruned")],
                            nvml=lambda: NvmlHealth(lambda: (_ for _ in ()).throw(ImportError("none"))))

    async def play() -> None:
        task = asyncio.create_task(monitor.run())
        await asyncio.sleep(0.3)
        registered[0] = True  # the welcome came: the verdict goes again without waiting for the interval
        await asyncio.sleep(0.8)
        task.cancel()

    asyncio.run(play())
    assert len(sent) == 2 and sent[1][0] - sent[0][0] < 0.9  # not the 5 s interval
    report = sent[0][1]
    assert report.checks == [HealthCheck.command, HealthCheck.log_dir, HealthCheck.checkpoint_dir]
    assert report.reasons()[0] == "command: failed (exit code 1)" and len(report.reasons()) == 2
    assert report.reasons()[1].startswith("checkpoint_dir: /proc is not writable")
    assert not (tmp_path / "pruned").exists()  # a checkpoint folder is the ranks': never made by the check


class WedgedNvml(NvmlHealth):
    """NVML that answers the set-up, then hangs on every read (a wedged driver)."""

    def __init__(self) -> None:
        super().__init__(lambda: (_ for _ in ()).throw(ImportError("none")))
        self.nvml = object()

    def checks(self) -> list[HealthCheck]:
        return [HealthCheck.ecc]

    def check(self) -> list[HealthFinding]:
        time.sleep(1.5)
        return []


def test_a_wedged_nvml_is_a_reason_and_is_not_asked_again_while_it_hangs(tmp_path: Path) -> None:
    cfg = JobConfig(1, 1, 1, "127.0.0.1", 29400, "job", "a", ["train.py"], log_dir=str(tmp_path),
                    health_interval_s=5.0, health_timeout_s=0.3)
    monitor = HealthMonitor(cfg, lambda _r: None, lambda: False)
    monitor.nvml = WedgedNvml()

    async def twice() -> tuple[HealthReport, HealthReport, float]:
        started = time.monotonic()
        return await monitor.check(), await monitor.check(), time.monotonic() - started

    first, second, took = asyncio.run(twice())
    assert first.reasons() == ["nvml: NVML did not answer within 0.3s"]
    assert second.reasons() == ["nvml: NVML has not answered for over 0.3s"] and took < 1.4  # not waited for


def test_a_check_that_raises_is_logged_and_the_monitor_goes_on(tmp_path: Path) -> None:
    cfg = JobConfig(1, 1, 1, "127.0.0.1", 29400, "job", "a", ["train.py"], log_dir=str(tmp_path),
                    health_interval_s=0.2, health_timeout_s=5.0)
    calls: list[int] = []

    def checkpoints() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a check")
        return []

    sent: list[HealthReport] = []
    monitor = HealthMonitor(cfg, sent.append, lambda: False, checkpoints,
                            nvml=lambda: NvmlHealth(lambda: (_ for _ in ()).throw(ImportError("none"))))

    async def play() -> None:
        task = asyncio.create_task(monitor.run())
        await asyncio.sleep(0.9)
        task.cancel()

    asyncio.run(play())
    assert len(calls) >= 3 and sent and all(r.healthy for r in sent)


def test_only_local_checkpoint_folders_are_checked() -> None:
    from elasticd.member.rank_reports import RankReports
    from elasticd.wire.worker_reports import Saved

    reports = RankReports()
    for rank, path in enumerate(("/mnt/ckpt/step-40/rank-0.pt", "s3://bucket/run/step-40/rank-1.pt")):
        reports.hello(rank, 3, 0.0, in_place=True)
        reports.checkpoint(Saved(rank, 40, path, 1024, 0.5), 1.0)
    assert reports.checkpoint_folders() == ["/mnt/ckpt/step-40"]
