"""Who may ask a service: TLS on its ports (a server certificate; client certificates as an
option), a bearer token checked before any work, and the rule that a service reachable from other
hosts has both unless its operator says otherwise. The client's side is :class:`ClientCredentials`.

What is answered without a token: the gRPC health service and REST ``/healthz`` / ``/readyz``
(an orchestrator's probes carry no credentials, and they tell only whether the service serves) and
the search page's HTML at ``/`` (no data: the page asks for the token and sends it with every
request it makes). Over TLS, these too need the handshake, and with ``client_ca`` a client certificate.
"""

from __future__ import annotations

import hmac
import ssl
from dataclasses import dataclass

import grpc
from tfhash.serving.page import is_loopback_host

__all__ = ["TOKEN_HEADER", "OPEN_GRPC_PREFIX", "OPEN_REST_PATHS", "MIN_TOKEN_CHARS", "Access", "ServerAccess", "authorized",
           "ClientCredentials"]  # fmt: skip

#: The metadata key (gRPC) and header (REST) carrying ``Bearer <token>``.
TOKEN_HEADER = "authorization"
#: gRPC methods answered without a token (health checking).
OPEN_GRPC_PREFIX = "/grpc.health.v1.Health/"
#: REST paths answered without a token (probes, and the page's HTML).
OPEN_REST_PATHS = ("/healthz", "/readyz", "/")
#: A shorter token is refused: it could be guessed.
MIN_TOKEN_CHARS = 16
MAKE_TOKEN = "python -c 'import secrets; print(secrets.token_urlsafe(32))' > token"


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as err:
        raise ValueError(f"cannot read the {what} {path!r}: {err.strerror or err}") from err


def authorized(header: str | None, token: bytes) -> bool:
    """Whether an ``authorization`` value is ``Bearer <token>`` (the scheme in any case), compared
    in constant time (:func:`hmac.compare_digest`: the time does not tell how much of a guess matched)."""
    scheme, _, presented = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token)


@dataclass(frozen=True, kw_only=True)
class Access:
    """Who may ask a service, as its operator states it (file paths and a flag: it travels to a
    service's processes as JSON).

    Args:
        tls_cert, tls_key: the server's certificate chain and private key (PEM files); both or
            neither. With them every port speaks TLS only.
        client_ca: (with TLS) accept only clients whose certificate this CA (PEM) signed.
        token_file: a file holding the bearer token every request must carry (surrounding white
            space is dropped; at least :data:`MIN_TOKEN_CHARS` characters).
        allow_insecure: bind beyond loopback without TLS or without a token (refused otherwise).

    Raises:
        ValueError: a certificate without its key (or the reverse), or a client CA without TLS.
    """

    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    token_file: str | None = None
    allow_insecure: bool = False

    def __post_init__(self):
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both a certificate and its private key: pass --tls-cert and --tls-key together")
        if self.client_ca and not self.tls_cert:
            raise ValueError("--client-ca checks client certificates during the TLS handshake: pass --tls-cert and --tls-key too")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    def check_bind(self, host: str) -> None:
        """Refuse a bind address other hosts can reach (anything but loopback) unless the service
        has TLS and a token, or :attr:`allow_insecure`.

        Raises:
            ValueError: naming the address, what is missing and the fix.
        """
        if is_loopback_host(host) or self.allow_insecure or (self.tls and self.token_file):
            return
        missing = " and ".join(what for what, present in (("TLS (--tls-cert, --tls-key)", self.tls), ("a token (--token-file)", self.token_file))
                               if not present)  # fmt: skip
        raise ValueError(f"bind address {host!r} is reachable from other hosts, and the service has no {missing}: anyone who reaches "
                         "the port could search it and read what it sends. Pass them (docs/serving.md, 'Beyond loopback'), bind "
                         "127.0.0.1, or pass --allow-insecure on a network you trust")  # fmt: skip

    def load(self) -> ServerAccess:
        """Read and check the files (once, when the service starts).

        Raises:
            ValueError: a file that cannot be read, a certificate and key that do not load or do
                not match, a token that is empty or shorter than :data:`MIN_TOKEN_CHARS`.
        """
        token = None
        if self.token_file:
            token = _read(self.token_file, "token file").strip()
            if len(token) < MIN_TOKEN_CHARS:
                raise ValueError(f"the token in {self.token_file!r} has {len(token)} characters; it needs at least {MIN_TOKEN_CHARS}: "
                                 f"make one with {MAKE_TOKEN}")  # fmt: skip
            if not token.isascii() or any(c <= 32 or c == 127 for c in token):
                raise ValueError(f"the token in {self.token_file!r} must be printable ASCII without spaces (it travels in a header): "
                                 f"make one with {MAKE_TOKEN}")  # fmt: skip
        if not self.tls:
            return ServerAccess(token=token)
        cert, key = _read(self.tls_cert, "certificate"), _read(self.tls_key, "private key")
        client_ca = _read(self.client_ca, "client CA") if self.client_ca else None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert, self.tls_key)
            if self.client_ca:
                context.load_verify_locations(self.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except ssl.SSLError as err:
            raise ValueError(f"the certificate {self.tls_cert!r}, key {self.tls_key!r}" + (f" or client CA {self.client_ca!r}" if self.client_ca else "")
                             + f" do not load ({err.reason or err}): they must be PEM files, the key the certificate's") from err  # fmt: skip
        credentials = grpc.ssl_server_credentials([(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None)
        return ServerAccess(token=token, grpc_credentials=credentials, ssl_context=context)


@dataclass(frozen=True)
class ServerAccess:
    """:class:`Access` loaded: the token's bytes (None: no token asked), gRPC's server credentials
    and the HTTP server's SSL context (None: plaintext)."""

    token: bytes | None = None
    grpc_credentials: grpc.ServerCredentials | None = None
    ssl_context: ssl.SSLContext | None = None

    def grpc_interceptors(self) -> list:
        """The token check for a ``grpc.aio`` server (none without a token)."""
        return [] if self.token is None else [_TokenCheck(self)]

    def grpc_refusal(self, method: str, metadata) -> str | None:
        """Why a gRPC call of ``method`` with this invocation metadata is refused (None: it may pass)."""
        if self.token is None or method.startswith(OPEN_GRPC_PREFIX):
            return None
        header = next((value for key, value in metadata or () if key == TOKEN_HEADER), None)
        if isinstance(header, bytes):
            header = header.decode("utf-8", "replace")
        if authorized(header, self.token):
            return None
        return "this service needs a bearer token: send the metadata 'authorization: Bearer <token>'" if not header else "the bearer token is not valid"

    def rest_refusal(self, path: str, header: str | None) -> str | None:
        """Why a REST request to ``path`` with this ``Authorization`` header is refused (None: it may pass)."""
        if self.token is None or path in OPEN_REST_PATHS or authorized(header, self.token):
            return None
        return "this service needs a bearer token: send the header 'Authorization: Bearer <token>'" if not header else "the bearer token is not valid"


class _TokenCheck(grpc.aio.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call of a ``grpc.aio`` server without the token, before its
    request is read (the health service's calls pass)."""

    def __init__(self, access: ServerAccess):
        self.access = access

    async def intercept_service(self, continuation, details):
        refusal = self.access.grpc_refusal(details.method, details.invocation_metadata)
        if refusal is None:
            return await continuation(details)

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refusal)

        return grpc.unary_unary_rpc_method_handler(refuse)


@dataclass(frozen=True, kw_only=True)
class ClientCredentials:
    """A client's side of :class:`Access`, for :class:`~tfhash.serving.search_client.SearchClient`
    (any :class:`~tfhash.serving.channel.ChannelClient`).

    Args:
        ca_file: the CA (PEM) that signed the service's certificate; with ``tls`` and no
            ``ca_file``, the system's roots.
        cert_file, key_file: this client's certificate and key (PEM), for a service started with
            ``--client-ca``.
        token_file, token: the bearer token (a file, or the value); sent with every call.
        tls: speak TLS (implied by any of the files above).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token_file: str | None = None
    token: str | None = None
    tls: bool = False

    def __post_init__(self):
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a client certificate needs its key: pass cert_file and key_file together")
        if self.token and self.token_file:
            raise ValueError("pass token or token_file, not both")

    def channel(self, target: str, options=()) -> grpc.Channel:
        """A channel to ``target``: TLS when any file or ``tls`` is given, else plaintext."""
        if not (self.tls or self.ca_file or self.cert_file):
            return grpc.insecure_channel(target, options=list(options))
        root = _read(self.ca_file, "CA file") if self.ca_file else None
        cert = _read(self.cert_file, "client certificate") if self.cert_file else None
        key = _read(self.key_file, "client key") if self.key_file else None
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root, key, cert), options=list(options))

    def metadata(self) -> tuple:
        """What every call carries: the token's header, when there is one."""
        token = _read(self.token_file, "token file").decode().strip() if self.token_file else self.token
        return ((TOKEN_HEADER, f"Bearer {token}"),) if token else ()
