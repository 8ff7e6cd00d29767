"""A Cloud Storage bucket on loopback for the tests, spoken to by the real clients.

The process (``python -m tests.storage_emulator BUCKET``) runs three servers and prints their
addresses as one JSON line:

* gcp-storage-emulator (PyPI), Cloud Storage's JSON API in memory; one fix: a zero-byte upload (the
  folder markers TensorFlow writes) is stored, not refused;
* a TLS proxy in front of it for TensorFlow's own GCS client, whose endpoints are fixed in
  ``libtensorflow_framework`` (``https://storage.googleapis.com``; no setting points it elsewhere):
  the client reaches the emulator through ``https_proxy`` and trusts the proxy's certificate through
  ``CURL_CA_BUNDLE``. Beam's client (google-cloud-storage) reaches the emulator directly
  (``STORAGE_EMULATOR_HOST``);
* a GCE metadata server that hands out tokens, as the metadata server of a GKE node does for a pod
  (``GCE_METADATA_HOST``), so both clients authenticate as they would on a cluster.

:class:`StorageEmulator` starts the process and gives the environment that points both clients at it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOOPBACK = "127.0.0.1"
PROJECT = "tfhash-tests"


def self_signed_certificate(folder: str) -> tuple[str, str]:
    """A certificate and key for the Google API hosts, valid for a day (``cert.pem``, ``key.pem``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "storage.googleapis.com")])
    now = datetime.datetime.now(datetime.timezone.utc)
    hosts = ["storage.googleapis.com", "www.googleapis.com", "*.googleapis.com"]
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))  # fmt: skip
    cert_path, key_path = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
    with open(cert_path, "wb") as handle:
        handle.write(certificate.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


# --- the process side ----------------------------------------------------------------------------


def start_emulator(bucket: str):
    """gcp-storage-emulator in memory on a free loopback port, holding ``bucket``; returns it and its port."""
    from gcp_storage_emulator import server

    read_data = server._read_data

    def with_empty_uploads(handler, query):  # the emulator reads an empty upload as "no body" and fails on it
        data = read_data(handler, query)
        kind = handler.headers.get("Content-Type") or ""
        if data is None and handler.command in ("POST", "PUT") and not kind.startswith(("application/json", "multipart/")):
            return b""
        return data

    server._read_data = with_empty_uploads
    emulator = server.create_server(LOOPBACK, 0, in_memory=True, default_bucket=bucket, project_number=PROJECT)
    emulator.start()
    return emulator, emulator._api._httpd.server_address[1]


def _read_head(connection) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return None
        data += chunk
    return data


def _read_exactly(connection, data: bytes, size: int) -> bytes:
    while len(data) < size:
        chunk = connection.recv(65536)
        if not chunk:
            raise ConnectionError("the client closed the connection mid-body")
        data += chunk
    return data


def plain_request(connection, head: bytes) -> bytes:
    """The request whose head (and first body bytes) is ``head``, as the emulator (an HTTP/1.0
    server) reads it: origin-form target, the body whole with its length (curl sends chunked
    uploads), no ``Expect: 100-continue`` (answered here)."""
    head, _, rest = head.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, target, version = lines[0].split(b" ", 2)
    if b"://" in target:
        target = b"/" + target.split(b"://", 1)[1].split(b"/", 1)[1]
    headers, chunked, length = [], False, None
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"expect":
            connection.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        elif name == b"content-length":
            length = int(value)
        elif name != b"proxy-connection":
            headers.append(line)
    body = b""
    if chunked:
        data = rest
        while True:
            while b"\r\n" not in data:
                data = _read_exactly(connection, data, len(data) + 1)
            size_line, _, data = data.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            data = _read_exactly(connection, data, size + 2)
            body, data = body + data[:size], data[size + 2:]
            if size == 0:
                break
    elif length:
        body = _read_exactly(connection, rest, length)[:length]
    headers.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join([b" ".join([method, target, version]), *headers]) + b"\r\n\r\n" + body


def serve_proxy(listener: socket.socket, emulator_port: int, context: ssl.SSLContext) -> None:
    """Answer each connection: a ``CONNECT`` is accepted and its TLS ended here; its one request goes
    to the emulator, whose answer (HTTP/1.0: it closes after it) goes back."""

    def handle(connection) -> None:
        client = connection
        try:
            head = _read_head(connection)
            if head is None:
                return
            if head.startswith(b"CONNECT "):
                connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                client = context.wrap_socket(connection, server_side=True)
                head = _read_head(client)
                if head is None:
                    return
            with socket.create_connection((LOOPBACK, emulator_port)) as upstream:
                upstream.sendall(plain_request(client, head))
                while True:
                    ready, _, _ = select.select([upstream], [], [], 120)
                    chunk = upstream.recv(65536) if ready else b""
                    if not chunk:
                        break
                    client.sendall(chunk)
        except (OSError, ValueError, ssl.SSLError):
            pass
        finally:
            client.close()

    while True:
        connection, _ = listener.accept()
        threading.Thread(target=handle, args=(connection,), daemon=True).start()


class MetadataHandler(BaseHTTPRequestHandler):
    """The GCE metadata server's answers that google-auth and TensorFlow ask for."""

    ANSWERS = {
        "/computeMetadata/v1/instance/service-accounts/default/token": {"access_token": "emulator-token", "expires_in": 3600,
                                                                          "token_type": "Bearer"},
        "/computeMetadata/v1/instance/service-accounts/default/": {"aliases": ["default"], "email": f"pipeline@{PROJECT}.iam",
                                                                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"]},
        "/computeMetadata/v1/instance/service-accounts/default/email": f"pipeline@{PROJECT}.iam",
        "/computeMetadata/v1/project/project-id": PROJECT,
        "/": "",
        "/computeMetadata/v1/": "",
    }  # fmt: skip

    def do_GET(self):
        answer = self.ANSWERS.get(self.path.split("?", 1)[0])
        body = (answer if isinstance(answer, str) else json.dumps(answer)).encode() if answer is not None else b"not found"
        self.send_response(200 if answer is not None else 404)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "text/plain" if isinstance(answer, str) else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def main(bucket: str) -> None:
    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)  # it logs every request
    folder = tempfile.mkdtemp(prefix="tfhash-gcs-")
    cert, key = self_signed_certificate(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    emulator, emulator_port = start_emulator(bucket)
    proxy = socket.create_server((LOOPBACK, 0), backlog=128)
    threading.Thread(target=serve_proxy, args=(proxy, emulator_port, context), daemon=True).start()
    metadata = ThreadingHTTPServer((LOOPBACK, 0), MetadataHandler)
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    print(json.dumps({"emulator": emulator_port, "proxy": proxy.getsockname()[1], "metadata": metadata.server_address[1],
                      "certificate": cert}), flush=True)  # fmt: skip
    sys.stdout = open(os.devnull, "w")  # nobody reads the pipe any more
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5) and os.getppid() != 1:  # also ends when the test process dies
        pass
    emulator.stop()


# --- the test side -------------------------------------------------------------------------------


class StorageEmulator:
    """The emulator process, and the environment that points TensorFlow's and Beam's clients at it."""

    def __init__(self, bucket: str = "tfhash-test-bucket"):
        self.bucket = bucket
        self.process = subprocess.Popen([sys.executable, "-m", "tests.storage_emulator", bucket], stdout=subprocess.PIPE,
                                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the storage emulator did not start (exit code {self.process.wait(10)})")
        self.ports = json.loads(line)

    @property
    def root(self) -> str:
        return f"gs://{self.bucket}"

    def environment(self) -> dict[str, str]:
        """What a process needs to reach the bucket with TensorFlow's and Beam's clients (fresh
        processes; TensorFlow reads the retry settings at its first ``gs://`` access)."""
        proxy = f"http://{LOOPBACK}:{self.ports['proxy']}"
        metadata = f"{LOOPBACK}:{self.ports['metadata']}"
        return {
            # the emulator answers an upload with a session URL of http://<the Host asked for>: both schemes go through the proxy
            "https_proxy": proxy, "HTTPS_PROXY": proxy, "http_proxy": proxy, "HTTP_PROXY": proxy, "no_proxy": f"{LOOPBACK},localhost", "NO_PROXY": f"{LOOPBACK},localhost",
            "CURL_CA_BUNDLE": self.ports["certificate"], "STORAGE_EMULATOR_HOST": f"http://{LOOPBACK}:{self.ports['emulator']}",
            "GCE_METADATA_HOST": metadata, "GCE_METADATA_IP": metadata, "GOOGLE_CLOUD_PROJECT": PROJECT,
            # TensorFlow's client retries a failed request 10 times over 3 minutes by default
            "GCS_RETRY_CONFIG_MAX_RETRIES": "2", "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
        }  # fmt: skip

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


if __name__ == "__main__":
    main(sys.argv[1])
