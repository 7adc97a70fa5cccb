"""--rdzv-backend etcd over TLS with client certificates and etcd's users and roles: a real three-member cluster."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.etcd_cluster import EtcdCluster, ask, etcd_job, wait_event
from support.etcd_tls import Authority, Pair, enable_rbac, set_rights
from support.harness import SHIM, TICKER, Job, sample_lines, wait_for
from support.system_deps import require_binary

from elasticd.coordinator.etcd.client import EtcdClient, put
from elasticd.job.config import EtcdAccess

PASSWORD = "trainer-pw-7f3a9c"  # the daemons' etcd password: no process of the job may show it
JOB_PREFIX = "/elasticd/"


class Pki:
    """The job's CA with etcd's server certificate, an admin's and the daemons'; a stranger's from another CA."""

    def __init__(self, folder: Path) -> None:
        job, other = Authority(folder, "job"), Authority(folder, "other")
        self.server, self.admin, self.daemon = job.issue("etcd", server=True), job.issue("admin"), job.issue("nodes")
        self.stranger: Pair = other.issue("nodes")
        self.password_file = folder / "etcd-password"
        self.password_file.write_text(PASSWORD + "\n")
        self.password_file.chmod(0o600)

    def conf(self, pair: Pair | None, user: str = "trainer", secret: str = "") -> str:
        """--rdzv-conf for a daemon: TLS with `pair` as its client certificate (None: none) and a login as `user`."""
        files = f"cacert={self.server.ca}" + (f",cert={pair.cert},key={pair.key}" if pair else "")
        return f"protocol=https,{files},user={user},{secret or f'password_file={self.password_file}'}"


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdCluster, Pki]]:
    """Three members, TLS for clients and peers, client certificates required, authentication on; simple tokens
    expire after 2 s unused (the daemons' logins must renew them)."""
    folder = tmp_path_factory.mktemp("etcd-tls")
    pki = Pki(folder)
    binary = require_binary("etcd", "etcd-server")
    with EtcdCluster(binary, folder, size=3, tls=pki.server, admin=pki.admin,
                     flags=("--auth-token-ttl", "2")).start() as etcd:
        enable_rbac(etcd.url(0), pki.admin, {"trainer": (PASSWORD, JOB_PREFIX),
                                             "outsider": ("outsider-pw", "/elasticd/some-other-job/")})
        yield etcd, pki


def tls_job(tmp: Path, etcd: EtcdCluster, pki: Pki, nnodes: str) -> Job:
    job = etcd_job(tmp, etcd, nnodes, conf=pki.conf(pki.daemon))
    job.env["REQUESTS_CA_BUNDLE"] = "/etc/ssl/certs/ca-certificates.crt"  # the trap: the job's CA must still win
    return job


def test_four_daemons_with_certificates_form_a_job_hand_over_on_sigterm_losing_no_step_and_survive_sigkill(
        tmp_path: Path, tls_etcd: tuple[EtcdCluster, Pki]) -> None:
    etcd, pki = tls_etcd
    with tls_job(tmp_path, etcd, pki, "2:4") as job:
        samples = tmp_path / "samples"
        args = ("--steps", "100000", "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "0", "--step-time", "0.05",
                "--batch", "24", "--micro", "4", "--sample-log", str(samples))
        a, b, *_ = (job.start(n, SHIM, *args) for n in "abcd")
        full = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 4)
        wait_event(job, "b", "first_step", since=full["seq"])
        status = ask(job, "b", "status")
        assert status["coordinator"] == "a" and status["etcd"]["access"] == "https, client certificate, user trainer"
        wait_for(lambda: len(sample_lines(samples).get(3, [])) > 5)

        a.signal(signal.SIGTERM)  # the coordinator's node leaves: drained at one step, handed over
        assert a.wait_exit(30) == 0
        three = wait_event(job, "b", "round_started", lambda e: e["world_size"] == 3, since=full["seq"])
        wait_event(job, "b", "first_step", since=three["seq"])
        wait_for(lambda: any(f"round{three['round']}" in p.name and p.read_text() for p in samples.iterdir()))
        steps = [step for step, _ in sample_lines(samples)[0]]
        assert steps == list(range(1, len(steps) + 1)), "a step was lost or repeated across the handover"
        handed = ask(job, "b", "status")
        assert handed["coordinator"] in "bcd" and handed["epoch"] > status["epoch"]

        coordinator = job.daemon(handed["coordinator"])
        coordinator.kill_with_workers()  # and now the new coordinator's node dies outright
        survivor = next(n for n in "bcd" if n != handed["coordinator"])
        two = wait_event(job, survivor, "round_started", lambda e: e["world_size"] == 2, since=three["seq"])
        wait_event(job, survivor, "first_step", since=two["seq"])
        after = ask(job, survivor, "status")
        assert after["coordinator"] != handed["coordinator"] and after["epoch"] > handed["epoch"]
        assert after["etcd"]["ok"] and after["restarts"]["failure"] == 0
        assert "invalid auth token" not in b.output() and "Traceback" not in b.output()


def refusals(pki: Pki) -> dict[str, tuple[str, str]]:
    """What a daemon without access is, as --rdzv-conf; the one line it must say."""
    tls_refused = "etcd refused our TLS handshake: it wants a client certificate from its CA; ours: "
    return {
        "no client certificate": (pki.conf(None), tls_refused + "none given"),
        "another CA's certificate": (pki.conf(pki.stranger), tls_refused + f"cert={pki.stranger.cert}"),
        "a role without the job's prefix": (pki.conf(pki.daemon, "outsider", "password_env=OUTSIDER_PW"),
                                            "etcd: user 'outsider' may not read and write /elasticd/job"),
        "a wrong password": (pki.conf(pki.daemon, "trainer", "password_env=WRONG_PW"),
                             "etcd login as 'trainer' failed: wrong user or password"),
    }


def family(job: Job) -> list[psutil.Process]:
    """Every live daemon of the job and all its descendants (zygote, workers)."""
    procs = []
    for daemon in job.started:
        if daemon.proc.poll() is None:
            root = psutil.Process(daemon.proc.pid)
            procs += [root, *root.children(recursive=True)]
    return procs


def test_a_daemon_without_access_is_refused_with_one_line_and_the_job_is_unchanged_and_no_process_shows_a_password(
        tmp_path: Path, tls_etcd: tuple[EtcdCluster, Pki]) -> None:
    etcd, pki = tls_etcd
    with tls_job(tmp_path, etcd, pki, "1:3") as job:
        job.start("a", TICKER)
        formed = wait_event(job, "a", "round_started", lambda e: e["world_size"] == 1)
        job.env.update(OUTSIDER_PW="outsider-pw", WRONG_PW="not-it")
        for name, (conf, said) in refusals(pki).items():
            intruder = job.start(f"x{len(job.started)}", TICKER, extra=["--rdzv-conf", f"lease_ttl=2,{conf}"],
                                 wait=False)
            assert intruder.wait_exit(30) == 2, name
            lines = [line for line in intruder.output().splitlines() if line.strip()]
            assert len(lines) == 1 and said in lines[0] and lines[0].startswith("elasticd start:"), (name, lines)
        status = ask(job, "a", "status")
        assert (status["round"], status["world_size"]) == (formed["round"], 1)
        assert [n["node_id"] for n in status["nodes"]] == ["a"]

        # a's password comes from a file, b's from a variable: no command line shows it, and no child inherits it.
        job.env["TRAINER_PW"] = PASSWORD
        from_env = pki.conf(pki.daemon, "trainer", "password_env=TRAINER_PW")
        job.start("b", TICKER, extra=["--rdzv-conf", f"lease_ttl=2,{from_env}"])
        wait_event(job, "a", "round_started", lambda e: e["world_size"] == 2)
        job.daemon("b").wait_line(r"\[b:1\] ")
        procs = family(job)
        assert len(procs) >= 6  # two daemons, their zygotes and workers were looked at
        for proc in procs:
            assert PASSWORD not in " ".join(proc.cmdline()), proc.cmdline()
            if proc.pid != job.daemon("b").proc.pid:  # b's own start-up environment is its operator's
                assert PASSWORD not in proc.environ().values(), proc.cmdline()


def test_a_role_revoked_mid_job_is_an_etcd_outage_with_that_reason_and_granted_again_the_job_goes_on(
        tmp_path: Path, tls_etcd: tuple[EtcdCluster, Pki]) -> None:
    etcd, pki = tls_etcd
    with tls_job(tmp_path, etcd, pki, "1:2") as job:
        job.start("a", TICKER)
        formed = wait_event(job, "a", "round_started")
        set_rights(etcd.url(0), pki.admin, "trainer-role", JOB_PREFIX, granted=False)
        try:
            down = wait_event(job, "a", "etcd_unreachable", since=formed["seq"])
            assert "etcd: user 'trainer' may not read and write /elasticd/job" in down["detail"]
            time.sleep(2.0)  # several keep-alives: they need no rights on the job's keys, and must not say all is well
            status = ask(job, "a", "status")
            assert not status["etcd"]["ok"] and "membership frozen" in status["reason"]
            kinds = [e["kind"] for e in ask(job, "a", "events", since_seq=down["seq"], limit=0)["events"]]
            assert "etcd_restored" not in kinds, kinds
        finally:
            set_rights(etcd.url(0), pki.admin, "trainer-role", JOB_PREFIX, granted=True)
        wait_event(job, "a", "etcd_restored", since=down["seq"])
        after = ask(job, "a", "status")
        assert after["etcd"]["ok"] and (after["round"], after["state"]) == (formed["round"], "running")
        assert job.daemon("a").proc.poll() is None and "Traceback" not in job.daemon("a").output()


def test_a_password_on_the_command_line_is_refused_without_echoing_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "elasticd.cli", "start", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:2379",
         "--rdzv-conf", "user=trainer,password=hunter2", "--nnodes", "1", TICKER.as_posix()],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "hunter2" not in result.stderr + result.stdout
    assert "a password is never taken on the command line" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_jwt_is_renewed_before_it_expires_and_when_the_roles_change(tmp_path: Path,
                                                                      tls_etcd: tuple[EtcdCluster, Pki]) -> None:
    """etcd signing 6 s JWTs: renewed a third of its life early, while the old one is still good. A JWT carries the
    auth store's revision: once an admin changes any role, etcd refuses it ("revision of auth store is old", a 400
    that once deposed a coordinator mid-job), and the client logs in again and goes on."""
    _, pki = tls_etcd
    openssl = require_binary("openssl", "openssl")
    signing = tmp_path / "jwt.key"
    subprocess.run([openssl, "genrsa", "-out", signing, "2048"], check=True, capture_output=True, timeout=60)
    subprocess.run([openssl, "rsa", "-in", signing, "-pubout", "-out", f"{signing}.pub"], check=True,
                   capture_output=True, timeout=60)
    jwt = f"jwt,pub-key={signing}.pub,priv-key={signing},sign-method=RS256,ttl=6s"
    with EtcdCluster(require_binary("etcd", "etcd-server"), tmp_path, size=1, tls=pki.server, admin=pki.admin,
                     flags=("--auth-token", jwt)).start() as etcd:
        enable_rbac(etcd.url(0), pki.admin, {"trainer": (PASSWORD, JOB_PREFIX)})
        client = EtcdClient([("127.0.0.1", etcd.client_ports[0])], access=access(pki), password=lambda: PASSWORD)
        client.get_prefix(JOB_PREFIX)
        first, renew = client._token, client._token_until
        assert first.count(".") == 2 and 0 < renew - time.time() < 6 * 2 / 3 + 0.5
        time.sleep(max(0.0, renew - time.time()) + 0.2)  # past the renewal, well before the token's expiry
        client.get_prefix(JOB_PREFIX)
        assert client._token != first
        second = client._token
        set_rights(etcd.url(0), pki.admin, "trainer-role", JOB_PREFIX, granted=True)  # the auth store moves on
        client.txn([], [put(f"{JOB_PREFIX}probe", "1")])
        assert client._token != second and client.get_prefix(f"{JOB_PREFIX}probe")[0][0].value == b"1"


def access(pki: Pki) -> EtcdAccess:
    return EtcdAccess("https", str(pki.server.ca), str(pki.daemon.cert), str(pki.daemon.key), "trainer",
                      str(pki.password_file))


def test_a_login_renews_its_token_once_etcd_has_expired_it(tls_etcd: tuple[EtcdCluster, Pki]) -> None:
    etcd, pki = tls_etcd
    client = EtcdClient([("127.0.0.1", port) for port in etcd.client_ports], access=access(pki),
                        password=lambda: PASSWORD)
    client.get_prefix(JOB_PREFIX)
    first = client._token
    time.sleep(3.0)  # past etcd's --auth-token-ttl 2 with the token unused: etcd forgot it
    client.get_prefix(JOB_PREFIX)
    assert client._token and client._token != first
    assert re.fullmatch(r"\w+\.\d+", first)  # etcd's simple token: renewed on expiry, as a JWT is before its own

