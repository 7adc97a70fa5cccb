"""--rdzv-conf's etcd TLS and login settings, checked at start-up: each mistake is one line that names the setting."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from support.harness import TICKER

from elasticd.cli.main import build_parser
from elasticd.cli.start import config_from_args
from elasticd.coordinator.etcd.access import check_files, password_source
from elasticd.coordinator.etcd.errors import EtcdRefused
from elasticd.job.config import ConfigError, EtcdAccess

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

DAY = datetime.timedelta(days=1)


def write_cert(folder: Path, name: str, start: datetime.datetime, end: datetime.datetime) -> tuple[str, str]:
    """A self-signed certificate valid from `start` to `end`, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def access(conf: str) -> EtcdAccess:
    ns = build_parser().parse_args(["start", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:2379",
                                    "--rdzv-conf", conf, str(TICKER)])
    return config_from_args(ns)[0].etcd_access


def test_torchruns_tls_names_and_a_login_reach_the_config(tmp_path: Path) -> None:
    cert, key = write_cert(tmp_path, "node", datetime.datetime.now(datetime.timezone.utc) - DAY,
                           datetime.datetime.now(datetime.timezone.utc) + DAY)
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    got = access(f"cacert={cert},cert={cert},key={key},user=trainer,password_file={secret}")
    assert got == EtcdAccess("https", cert, cert, key, "trainer", str(secret))  # a certificate means https
    assert got.describe() == "https, client certificate, user trainer"
    assert password_source(got)() == "s3cret"
    assert access("lease_ttl=3") == EtcdAccess()  # plain http, no login: as before


@pytest.mark.parametrize(("conf", "said"), [
    ("protocol=http,cacert={cert}", "cacert needs protocol=https"),
    ("cert={cert}", "cert and key go together"),
    ("protocol=gopher", "protocol must be http or https, got 'gopher'"),
    ("cacert=/nowhere/ca.pem", "--rdzv-conf cacert: /nowhere/ca.pem: no such file"),
    ("user=trainer", "user= needs its password in exactly one of password_file=PATH or password_env=VARIABLE"),
    ("user=trainer,password=hunter2", "a password is never taken on the command line"),
    ("user=trainer,password_env=NOT_SET_ANYWHERE", "password_env=NOT_SET_ANYWHERE: that variable is not set"),
])
def test_a_setting_that_cannot_work_is_one_line_naming_it(tmp_path: Path, conf: str, said: str) -> None:
    cert, _ = write_cert(tmp_path, "node", datetime.datetime.now(datetime.timezone.utc) - DAY,
                         datetime.datetime.now(datetime.timezone.utc) + DAY)
    with pytest.raises(ConfigError) as err:
        access(conf.format(cert=cert))
    assert said in str(err.value) and "hunter2" not in str(err.value)


def test_tls_settings_without_etcd_are_refused(tmp_path: Path) -> None:
    ns = build_parser().parse_args(["start", "--rdzv-conf", "protocol=https", str(TICKER)])
    with pytest.raises(ConfigError, match="only --rdzv-backend etcd talks to etcd"):
        config_from_args(ns)


def test_an_expired_or_mismatched_certificate_is_named_before_any_request(tmp_path: Path) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    old_cert, old_key = write_cert(tmp_path, "old", now - 3 * DAY, now - DAY)
    with pytest.raises(EtcdRefused, match=f"cert={old_cert} expired on"):
        check_files(EtcdAccess("https", old_cert, old_cert, old_key))
    cert, _ = write_cert(tmp_path, "new", now - DAY, now + DAY)
    with pytest.raises(EtcdRefused, match=f"cannot use cert={cert}, key={old_key}"):
        check_files(EtcdAccess("https", cert, cert, old_key))  # another certificate's key
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate")
    with pytest.raises(EtcdRefused, match=f"cannot use cacert={not_pem}"):
        check_files(EtcdAccess("https", str(not_pem)))
    check_files(EtcdAccess("https", cert, cert, str(tmp_path / "new.key")))  # in date, and its own key


def test_a_password_from_a_variable_leaves_the_environment_so_no_child_inherits_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_PW", "s3cret")
    source = password_source(EtcdAccess(user="trainer", password_env="ETCD_PW"))
    assert "ETCD_PW" not in os.environ and source() == "s3cret"


def test_the_jobs_ca_wins_over_requests_ca_bundle_and_without_one_the_environment_verifies(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from elasticd.coordinator.etcd.access import pinned_session

    bundle = tmp_path / "corporate.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    url = "https://127.0.0.1:2379/v3/kv/range"
    pinned = pinned_session(EtcdAccess("https", "/etc/elasticd/ca.crt"))
    assert pinned.merge_environment_settings(url, {}, None, None, None)["verify"] == "/etc/elasticd/ca.crt"
    plain = pinned_session(EtcdAccess("https"))
    assert plain.merge_environment_settings(url, {}, None, None, None)["verify"] == str(bundle)
