"""Who may ask (tfhash.serving.access): TLS on the search service's gRPC and REST ports and on the
development model server, client certificates, a bearer token checked before any work, and the
refusal to bind beyond loopback without them. Every stranger of the matrix is refused with its
status (UNAUTHENTICATED / 401, or the handshake failing) and no refused request reaches a search."""

from __future__ import annotations

import dataclasses
import json

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from tfhash.serving.access import MIN_TOKEN_CHARS, Access, ClientCredentials, authorized
from tfhash.serving.client import ModelClient
from tfhash.serving.deployment import model_config, models_config
from tfhash.serving.errors import ServingError
from tfhash.serving.model_server import DevModelServer
from tfhash.serving.processes import SearchOptions, start_command
from tfhash.serving.search_client import SearchClient
from tfhash.serving.search_service import SearchServer, remote_searcher

from benchmarks.certificates import make_certificates
from tests.faults import counted_server, fixture_versions, grpc_outcome, rest_outcome
from tests.serving_fixtures import cli_rest_port, stop_cli

MODEL = "vectors"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Version 1 of a model and its index, the queries and the library's answer
    (:func:`tests.faults.fixture_versions`), and the certificates and tokens."""
    root = tmp_path_factory.mktemp("access")
    with fixture_versions(str(root)) as versions:
        yield {**versions, **make_certificates(str(root / "pki"))}


def _token(path: str) -> str:
    with open(path) as file:
        return file.read().strip()


def test_access_settings_are_checked_before_anything_binds(files, tmp_path):
    with pytest.raises(ValueError, match="both a certificate and its private key"):
        Access(tls_cert=files["server"])
    with pytest.raises(ValueError, match="--client-ca .* --tls-cert"):
        Access(client_ca=files["ca"], token_file=files["token"])
    for host in ("0.0.0.0", "::", "192.0.2.7", "search.example"):
        for access in (Access(), Access(token_file=files["token"]), Access(tls_cert=files["server"], tls_key=files["server_key"])):
            with pytest.raises(ValueError, match=f"bind address '{host}' is reachable from other hosts.*--allow-insecure"):
                access.check_bind(host)
        Access(tls_cert=files["server"], tls_key=files["server_key"], token_file=files["token"]).check_bind(host)
        Access(allow_insecure=True).check_bind(host)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        Access().check_bind(host)
    short, spaced = tmp_path / "short", tmp_path / "spaced"
    short.write_text("x" * (MIN_TOKEN_CHARS - 1) + "\n")
    spaced.write_text("a" * 20 + " " + "b" * 20)
    with pytest.raises(ValueError, match=f"has {MIN_TOKEN_CHARS - 1} characters; it needs at least {MIN_TOKEN_CHARS}"):
        Access(token_file=str(short)).load()
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        Access(token_file=str(spaced)).load()
    with pytest.raises(ValueError, match="cannot read the token file"):
        Access(token_file=str(tmp_path / "missing")).load()
    with pytest.raises(ValueError, match="do not load"):  # a key that is not the certificate's
        Access(tls_cert=files["server"], tls_key=files["client_key"]).load()
    with pytest.raises(ValueError, match="do not load"):
        Access(tls_cert=files["token"], tls_key=files["server_key"]).load()
    token = _token(files["token"]).encode()
    assert authorized(f"Bearer {token.decode()}", token) and authorized(f"bearer  {token.decode()} ", token)
    for header in (None, "", token.decode(), f"Basic {token.decode()}", f"Bearer {token.decode()[:-1]}", f"Bearer {token.decode()}x",
                   f"Bearer {_token(files['wrong_token'])}", "Bearer \u00e9"):  # fmt: skip
        assert not authorized(header, token), header


def test_the_search_command_refuses_a_wide_bind_without_tls_and_a_token(files):
    """Exit 2 with the reason and the fix, before any process starts or any port is bound."""
    from tfhash.cli import main

    base = ["serve", "search", "--index-base-dir", files["indexes"], "--model-base-dir", files["models"], "--host", "0.0.0.0"]
    for extra in ([], ["--token-file", files["token"]], ["--processes", "2", "--tls-cert", files["server"], "--tls-key", files["server_key"]]):
        result = CliRunner().invoke(main, base + extra)
        assert result.exit_code == 2 and "reachable from other hosts" in result.output, result.output
    result = CliRunner().invoke(main, base + ["--tls-cert", files["server"]])
    assert result.exit_code == 2 and "--tls-cert and --tls-key together" in result.output
    result = CliRunner().invoke(main, ["serve", "model", "--model-name", MODEL, "--model-base-path", files["models"], "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "reachable from other hosts" in result.output, result.output
    result = CliRunner().invoke(main, ["serve", "model", "--model-name", MODEL, "--model-base-path", files["models"], "--allowed-model-root", "/tmp"])
    assert result.exit_code == 2 and "pass --reload-api too" in result.output


def test_every_option_of_the_search_command_reaches_the_server_by_its_name():
    """``tfhash serve search``'s options are the fields of SearchOptions (those of access as
    Access's, the model server's credentials as ClientCredentials'), by keyword only, and they
    survive the JSON a child process receives."""
    from tfhash.serving.cli import search

    command = {parameter.name for parameter in search.params} - {"config_path", "processes", "grace_seconds"}
    nested = {"access": {f.name for f in dataclasses.fields(Access)}, "model_server_credentials": {"model_server_ca", "model_server_token_file"}}
    fields = {f.name for f in dataclasses.fields(SearchOptions)}
    assert command == (fields - set(nested)) | set().union(*nested.values())
    with pytest.raises(TypeError):
        SearchOptions("indexes", "BFlat")  # noqa - positional values are refused
    options = SearchOptions(index_base_dir="indexes", access=Access(token_file="t", allow_insecure=True),
                            model_server_credentials=ClientCredentials(ca_file="ca.pem", token_file="u"))  # fmt: skip
    assert SearchOptions.from_json(json.loads(json.dumps(dataclasses.asdict(options)))) == options
    assert SearchOptions(index_base_dir="indexes").kind == "BFlat"


@pytest.mark.server
def test_tls_and_a_token_refuse_every_stranger_on_grpc_and_rest(files):
    """The matrix, on both fronts: only a client that trusts the service's CA and sends the token
    is answered; health and readiness answer without the token (over TLS); a refused request never
    reaches a search."""
    access = Access(tls_cert=files["server"], tls_key=files["server_key"], token_file=files["token"])
    server, answered = counted_server(files, access)
    token, wrong = _token(files["token"]), _token(files["wrong_token"])
    try:
        grpc_rows = {
            "valid": grpc_outcome(server, files, ca_file=files["ca"], token_file=files["token"]),
            "no token": grpc_outcome(server, files, ca_file=files["ca"]),
            "wrong token": grpc_outcome(server, files, ca_file=files["ca"], token=wrong),
            "plaintext": grpc_outcome(server, files, token=token),
            "another CA": grpc_outcome(server, files, ca_file=files["other_ca"], token=token),
        }
        rest_rows = {
            "valid": rest_outcome(server, files, token=token, ca=files["ca"]),
            "no token": rest_outcome(server, files, ca=files["ca"]),
            "wrong token": rest_outcome(server, files, token=wrong, ca=files["ca"]),
            "plaintext": rest_outcome(server, files, token=token, tls=False),
            "another CA": rest_outcome(server, files, token=token, ca=files["other_ca"]),
            "status without token": rest_outcome(server, files, "/v1/status", ca=files["ca"]),
            "healthz without token": rest_outcome(server, files, "/healthz", ca=files["ca"]),
            "readyz without token": rest_outcome(server, files, "/readyz", ca=files["ca"]),
        }
        with SearchClient(f"localhost:{server.port}", credentials=ClientCredentials(ca_file=files["ca"])) as client:
            assert client.health() == "SERVING"  # the health service asks no token
            with pytest.raises(ServingError) as err:
                client.status()
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in err.value.message
    finally:
        server.stop(0)
    assert grpc_rows == {"valid": "ok", "no token": "UNAUTHENTICATED", "wrong token": "UNAUTHENTICATED", "plaintext": "UNAVAILABLE",
                         "another CA": "UNAVAILABLE"}  # fmt: skip
    assert rest_rows == {"valid": "ok", "no token": "401", "wrong token": "401", "plaintext": "handshake", "another CA": "handshake",
                         "status without token": "401", "healthz without token": "ok", "readyz without token": "ok"}  # fmt: skip
    assert answered == [8, 8]  # the two valid requests; warm-up searches do not pass through answer

    expired = Access(tls_cert=files["expired_server"], tls_key=files["expired_server_key"], token_file=files["token"])
    server, answered = counted_server(files, expired)
    try:
        assert grpc_outcome(server, files, ca_file=files["ca"], token=token) == "UNAVAILABLE"
        assert rest_outcome(server, files, token=token, ca=files["ca"]) == "handshake"
    finally:
        server.stop(0)
    assert answered == []


@pytest.mark.server
def test_client_certificates_are_required_when_the_service_names_a_client_ca(files):
    access = Access(tls_cert=files["server"], tls_key=files["server_key"], client_ca=files["ca"])
    server, answered = counted_server(files, access)
    try:
        rows = {
            "own certificate": grpc_outcome(server, files, ca_file=files["ca"], cert_file=files["client"], key_file=files["client_key"]),
            "none": grpc_outcome(server, files, ca_file=files["ca"]),
            "expired": grpc_outcome(server, files, ca_file=files["ca"], cert_file=files["expired_client"],
                                     key_file=files["expired_client_key"]),  # fmt: skip
            "another CA's": grpc_outcome(server, files, ca_file=files["ca"], cert_file=files["stranger"], key_file=files["stranger_key"]),
            "REST own certificate": rest_outcome(server, files, ca=files["ca"], cert=(files["client"], files["client_key"])),
            "REST none": rest_outcome(server, files, ca=files["ca"]),
            "REST expired": rest_outcome(server, files, ca=files["ca"], cert=(files["expired_client"], files["expired_client_key"])),
            "REST another CA's": rest_outcome(server, files, ca=files["ca"], cert=(files["stranger"], files["stranger_key"])),
        }
    finally:
        server.stop(0)
    assert rows == {"own certificate": "ok", "none": "UNAVAILABLE", "expired": "UNAVAILABLE", "another CA's": "UNAVAILABLE",
                    "REST own certificate": "ok", "REST none": "handshake", "REST expired": "handshake", "REST another CA's": "handshake"}  # fmt: skip
    assert answered == [8, 8]


@pytest.mark.server
def test_the_model_server_takes_tls_and_a_token_and_its_reload_api_is_off_unless_asked(files):
    """The development model server: a client without the token is refused UNAUTHENTICATED; the
    search service encodes through it with its credentials; HandleReloadConfigRequest answers
    PERMISSION_DENIED unless the server was started with reload_api."""
    from tensorflow_serving.apis import model_management_pb2, model_service_pb2_grpc

    access = Access(tls_cert=files["server"], tls_key=files["server_key"], token_file=files["token"])
    server = DevModelServer(models_config([model_config(MODEL, files["models"])]), poll_seconds=0.2, access=access).start()
    credentials = ClientCredentials(ca_file=files["ca"], token_file=files["token"])
    target = f"localhost:{server.port}"
    try:
        with ModelClient(target, MODEL, credentials=ClientCredentials(ca_file=files["ca"])) as client, pytest.raises(ServingError) as err:
            client.status()
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        with ModelClient(target, MODEL, credentials=credentials) as client:
            assert [state for _, state, _ in client.status()] == ["AVAILABLE"]
        searcher = remote_searcher(target, MODEL, files["indexes"], model_base_dir=files["models"], credentials=credentials)
        search = SearchServer(searcher, poll_seconds=60).start()
        try:
            with SearchClient(search.address) as client:
                np.testing.assert_array_equal(np.stack(client.search(features=files["queries"]["features"], k=10).ids), files["expected"].ids)
        finally:
            search.stop(0)
        channel = credentials.channel(target)
        reload = model_service_pb2_grpc.ModelServiceStub(channel).HandleReloadConfigRequest
        with pytest.raises(grpc.RpcError) as err:
            reload(model_management_pb2.ReloadConfigRequest(config=models_config([model_config("other", "/etc")])),
                   metadata=credentials.metadata(), timeout=10)  # fmt: skip
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "--reload-api" in err.value.details()
        channel.close()
    finally:
        server.stop(0)


@pytest.mark.process
def test_a_service_of_two_processes_serves_tls_and_checks_the_token_in_each(files):
    """``tfhash serve search --processes 2`` with TLS and a token: the children read the settings
    from their JSON and every connection (spread over both processes) is checked."""
    process, address = start_command(["serve", "search", "--index-base-dir", files["indexes"], "--model-base-dir", files["models"],
                                       "--host", "127.0.0.1", "--port", "0", "--rest-port", "0", "--processes", "2",
                                       "--tls-cert", files["server"], "--tls-key", files["server_key"], "--token-file", files["token"]],
                                      "search service on")  # fmt: skip
    try:
        assert "TLS" in process.ready_line and "bearer token" in process.ready_line
        port = int(address.rsplit(":", 1)[1])
        rest = type("Rest", (), {"rest_port": cli_rest_port(process)})
        outcomes = []
        for _ in range(6):  # own connections: the kernel spreads them over the two processes
            with SearchClient(f"localhost:{port}", own_connection=True,
                              credentials=ClientCredentials(ca_file=files["ca"], token_file=files["token"])) as client:  # fmt: skip
                outcomes.append(np.array_equal(np.stack(client.search(features=files["queries"]["features"], k=10).ids), files["expected"].ids))
            with SearchClient(f"localhost:{port}", own_connection=True, credentials=ClientCredentials(ca_file=files["ca"])) as client:
                with pytest.raises(ServingError) as err:
                    client.search(features=files["queries"]["features"], k=10)
                outcomes.append(err.value.code == grpc.StatusCode.UNAUTHENTICATED)
            outcomes.append(rest_outcome(rest, files, token=_token(files["token"]), ca=files["ca"]) == "ok")
            outcomes.append(rest_outcome(rest, files, ca=files["ca"]) == "401")
        assert all(outcomes), outcomes
    finally:
        stop_cli(process)
