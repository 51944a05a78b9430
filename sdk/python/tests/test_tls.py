"""The SDK against a TLS-only `kiln up` that requires client certificates of its CA."""

import datetime
import ipaddress
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import kiln
from kiln._run import _channel, _endpoints
from kiln.v1 import log_pb2, log_pb2_grpc

REPO = pathlib.Path(__file__).resolve().parents[3]
KILN = os.environ.get("KILN_BIN", str(REPO / "target" / "debug" / "kiln"))
TLS_VARIABLES = ("KILN_CLIENT_CERT", "KILN_CLIENT_KEY", "KILN_CA_FILE", "KILN_CA_PEM", "KILN_CLIENT_CERT_PEM", "KILN_CLIENT_KEY_PEM")


class Ca:
    """A self-signed CA in `directory` that signs certificates for localhost and 127.0.0.1."""

    def __init__(self, directory: pathlib.Path, name: str):
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kiln test CA {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def sign(self, name: str, usage) -> tuple[pathlib.Path, pathlib.Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_file, key_file = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_file, key_file


@pytest.fixture(scope="module")
def tls_up():
    """`kiln up` serving TLS only and requiring client certificates; the SDK is given the CA
    (credentials.toml's ca-file) and a client certificate (KILN_CLIENT_CERT, KILN_CLIENT_KEY)."""
    if not pathlib.Path(KILN).exists():
        pytest.fail(f"{KILN} does not exist: run the tests through scripts/test.sh, which builds it")
    home = pathlib.Path(tempfile.mkdtemp(prefix="kiln-sdk-tls-"))
    ca = Ca(home, "kiln")
    server_cert, server_key = ca.sign("server", ExtendedKeyUsageOID.SERVER_AUTH)
    job_cert, job_key = ca.sign("job", ExtendedKeyUsageOID.CLIENT_AUTH)
    client_cert, client_key = ca.sign("sdk", ExtendedKeyUsageOID.CLIENT_AUTH)
    log = open(home / "up.log", "w")
    process = subprocess.Popen(
        [KILN, "up", "--provider", "process", "--api-addr", "127.0.0.1:0", "--logs-addr", "127.0.0.1:0",
         "--batch-addr", "127.0.0.1:0", "--advisor-addr", "127.0.0.1:0", "--predictor-addr", "127.0.0.1:0", "--predictor-http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
         "--tls-cert", str(server_cert), "--tls-key", str(server_key), "--tls-ca", str(ca.ca_file),
         "--tls-client-ca", str(ca.ca_file), "--job-client-cert", str(job_cert), "--job-client-key", str(job_key)],
        env={**os.environ, "KILN_HOME": str(home), "KILN_LOG": "warn"}, stdout=log, stderr=subprocess.STDOUT,
    )
    credentials = home / "credentials.toml"
    deadline = time.monotonic() + 60
    while not credentials.exists():
        assert process.poll() is None, (home / "up.log").read_text()
        assert time.monotonic() < deadline, "kiln up did not start"
        time.sleep(0.05)
    saved = {name: os.environ.get(name) for name in ("KILN_HOME", *TLS_VARIABLES)}
    for name in ("KILN_ADDR", "KILN_TOKEN", "KILN_LOGS_ADDR", "KILN_BATCH_ADDR", "KILN_JOB_ID", *TLS_VARIABLES):
        os.environ.pop(name, None)
    os.environ.update({"KILN_HOME": str(home), "KILN_CLIENT_CERT": str(client_cert), "KILN_CLIENT_KEY": str(client_key)})
    yield home
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    log.close()
    shutil.rmtree(home)


def stored_points(job_id: str, key: str) -> int:
    _, logs, token = _endpoints()
    stub = log_pb2_grpc.LogServiceStub(_channel(logs))
    request = log_pb2.QueryMetricsRequest(job_ids=[job_id], keys=[key], max_points=1000)
    found = stub.QueryMetrics(request, metadata=(("authorization", f"Bearer {token}"),)).series
    return found[0].total_points if found else 0


def wait_for_points(job_id: str, key: str, total: int) -> None:
    deadline = time.monotonic() + 30
    while stored_points(job_id, key) < total:
        assert time.monotonic() < deadline, f"the {total} points of {key} were not stored"
        time.sleep(0.05)


def test_a_run_and_a_job_log_over_tls(tls_up):
    api, _, _ = _endpoints()
    assert api.startswith("https://")
    run = kiln.init(name="over-tls")
    for step in range(50):
        kiln.log({"tls/loss": step * 1.0}, step=step)
    kiln.finish()
    wait_for_points(run.job_id, "tls/loss", 50)

    # Inside a job the SDK trusts and presents what the runner gave it (KILN_CA_PEM, ...).
    script = "import kiln\nkiln.init()\nkiln.log({'job/loss': 1.0}, step=0)\nkiln.finish()\nprint('logged')\n"
    done = subprocess.run([KILN, "run", "-f", "--no-code", "--", sys.executable, "-c", script],
                          env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "logged\n"
    wait_for_points(done.stderr.splitlines()[0].split()[1], "job/loss", 1)


def test_a_batch_from_python_over_tls(tls_up):
    with kiln.Client() as client:
        batch = client.batches.create(["true", "{item}"], cpu=0.1, memory_mb=64, max_workers=2)
        batch.add([f"mem://{n}" for n in range(20)])
        batch.seal()
        final = batch.wait(poll=0.2, timeout=120)
        assert (final.state, final.succeeded) == ("DONE", 20)


def test_plain_text_and_foreign_certificates_are_refused(tls_up):
    _, logs, token = _endpoints()
    metadata = (("authorization", f"Bearer {token}"),)
    request = log_pb2.QueryMetricsRequest(job_ids=["none"], keys=["k"])
    plain = log_pb2_grpc.LogServiceStub(grpc.insecure_channel(logs.split("://", 1)[1]))
    with pytest.raises(grpc.RpcError) as refused:
        plain.QueryMetrics(request, metadata=metadata, timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    other = Ca(tls_up, "other")
    foreign_cert, foreign_key = other.sign("foreign", ExtendedKeyUsageOID.CLIENT_AUTH)
    os.environ.update({"KILN_CLIENT_CERT": str(foreign_cert), "KILN_CLIENT_KEY": str(foreign_key)})
    try:
        with pytest.raises(grpc.RpcError) as refused:
            log_pb2_grpc.LogServiceStub(_channel(logs)).QueryMetrics(request, metadata=metadata, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        os.environ.update({"KILN_CLIENT_CERT": str(tls_up / "sdk.pem"), "KILN_CLIENT_KEY": str(tls_up / "sdk.key")})
