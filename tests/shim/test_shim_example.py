"""examples/train_shim.py end to end: a stand-in daemon drives checkpoint and drain over 2 DDP ranks."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

import zmq

from elasticd.wire.protocol import Envelope, decode, encode
from tests.support.harness import free_port
from trainer_shim.checkpoint import list_checkpoints, load_latest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "train_shim.py")


def test_drain_and_checkpoint_requests_two_ranks(tmp_path) -> None:
    d = tempfile.mkdtemp(prefix="shim", dir="/tmp")
    addr = f"ipc://{d}/w.sock"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(addr)
    port = free_port()  # for the rendezvous store
    # ELASTICD_REPORT_INTERVAL=0: a frame per report, since the test checks each rank reported every step.
    base = dict(os.environ, ELASTICD_WORKER_ADDR=addr, ELASTICD_NODE_ID="n0", ELASTICD_ROUND="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                ELASTICD_REPORT_INTERVAL="0")
    cmd = [sys.executable, SCRIPT, "--steps", "100000", "--ckpt-dir", str(tmp_path), "--ckpt-every", "0",
           "--step-time", "0.02", "--batch", "16"]
    # The workers as torchrun would start them, without the agent: one torch import fewer on 2 cores.
    procs = [subprocess.Popen(cmd, env=dict(base, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    events: list[Envelope] = []
    idents: dict[int, bytes] = {}
    try:
        deadline = time.monotonic() + 60
        requested = False
        while time.monotonic() < deadline:
            # Two fresh torch imports can take many seconds on a loaded machine: wait while both workers live.
            if not router.poll(1000):
                assert all(p.poll() is None for p in procs), "a worker exited before its frames arrived"
                continue
            ident, payload = router.recv_multipart()
            ev = decode(payload)
            events.append(ev)
            if ev.op == "hello":
                idents[ev.body["rank"]] = ident
            if ev.op == "step" and len(idents) == 2 and not requested:
                at = max(e.body["step"] for e in events if e.op == "step") + 15
                for ident in idents.values():  # the coordinator sends every rank the same at_step
                    for op, rid, at_step in (("checkpoint", "c1", at), ("drain", "d1", at + 5)):
                        body = {"request_id": rid, "at_step": at_step}
                        router.send_multipart([ident, encode(Envelope(type="req", op=op, body=body, id=rid))])
                requested = True
            if sum(e.op == "drained" for e in events) == 2:
                break
        outs = [p.communicate(timeout=30)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
        router.close()
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
    assert [p.returncode for p in procs] == [0, 0], outs
    acks = sorted((e.body["rank"], e.body["request_id"]) for e in events if e.op == "ack")
    assert acks == [(0, "c1"), (0, "d1"), (1, "c1"), (1, "d1")]
    saves = [e.body for e in events if e.op == "checkpoint"]
    assert [(s["rank"], s["request_id"]) for s in saves] == [(0, "c1"), (0, "d1")], (outs, [e.op for e in events])
    drained = sorted((e.body["rank"], e.body["step"], e.body["request_id"])
                     for e in events if e.op == "drained")
    at = saves[0]["step"]
    assert drained == [(0, at + 5, "d1"), (1, at + 5, "d1")] and saves[1]["step"] == at + 5
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [at, at + 5]
    # Every rank reported every step up to the drain: nothing was left waiting in a collective.
    for rank in (0, 1):
        steps = [e.body["step"] for e in events if e.op == "step" and e.body["rank"] == rank]
        assert steps == list(range(1, at + 6))
    assert f"drained at step={at + 5}" in outs[0]


def test_single_process_resumes_past_corrupt_checkpoint(tmp_path, monkeypatch, capsys) -> None:
    for name in [k for k in os.environ if k.startswith(("ELASTICD_", "RANK", "WORLD_SIZE", "MASTER_"))]:
        monkeypatch.delenv(name)
    args = ["--ckpt-dir", str(tmp_path), "--ckpt-every", "5", "--batch", "16"]
    # The first run in this process (no second torch import); the resume as a real bare `python script`.
    spec = importlib.util.spec_from_file_location("train_shim_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", [SCRIPT, *args, "--steps", "10"])
    assert module.main() == 0
    assert "step=10 world_size=1" in capsys.readouterr().out
    newest = os.path.join(tmp_path, "ckpt-00000010.pt")
    with open(newest, "r+b") as fh:
        fh.truncate(100)  # a torn write from a crash
    second = subprocess.run([sys.executable, SCRIPT, *args, "--steps", "12"], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 0, second.stderr
    assert "start_step=5" in second.stdout
    loaded = load_latest(str(tmp_path))
    assert loaded is not None and loaded.step == 10 and loaded.state["step"] == 10  # re-saved at 10
