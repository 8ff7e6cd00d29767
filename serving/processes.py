"""The processes of a search service: one (:func:`build_server`) or several on one port
(:class:`ProcessFront`, ``tfhash serve search --processes N``)."""

from __future__ import annotations

import ctypes
import dataclasses
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfhash.serving.access import Access, ClientCredentials
from tfhash.serving.grpc_server import (
    EXIT_SECONDS,
    LOOPBACK,
    BindError,
    grpc_address,
    run_until_signal,
)
from tfhash.serving.shared_status import SharedStatus, service_status, slot_path, withdraw

from tfhash import storage

if TYPE_CHECKING:
    from tfhash.serving.search_service import SearchServer

__all__ = ["SearchOptions", "build_server", "start_command", "ServiceFailed", "ProcessFront"]


logger = logging.getLogger(__name__)

#: How long the parent waits for its children to serve at start-up (loading a model takes seconds).
START_SECONDS = 600.0
#: After the grace period, how long a child may take to exit before it is killed.
EXIT_MARGIN_SECONDS = 5.0
@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """Everything one process of ``tfhash serve search`` is built from, given by keyword (plain
    values: it travels to child processes as JSON). The fields are the command's options, under
    the same names; ``access`` holds ``--tls-cert``, ``--tls-key``, ``--client-ca``, ``--token-file``
    and ``--allow-insecure``, ``model_server_credentials`` ``--model-server-ca`` and
    ``--model-server-token-file``."""

    index_base_dir: str
    kind: str = "BFlat"
    model_base_dir: str | None = None
    model_server: str | None = None
    model_name: str | None = None
    query_modality: str | None = None
    items_file: str | None = None
    image_root: str | None = None
    host: str = LOOPBACK
    port: int = 0
    rest_port: int | None = None
    max_k: int = 1000
    max_batch: int = 256
    max_request_mb: int = 8
    poll_seconds: float = 2.0
    search_threads: int = 1
    tf_threads: int = 0
    rest_timeout: float = 10.0
    event_loop: str = "auto"
    access: Access = field(default_factory=Access)
    model_server_credentials: ClientCredentials = field(default_factory=ClientCredentials)

    @classmethod
    def from_json(cls, fields: dict) -> SearchOptions:
        """The options of :func:`dataclasses.asdict`'s plain values (a child process's)."""
        return cls(**{**fields, "access": Access(**fields.get("access", {})),
                      "model_server_credentials": ClientCredentials(**fields.get("model_server_credentials", {}))})  # fmt: skip


def build_server(options: SearchOptions, siblings: SharedStatus | None = None, reuse_port: bool = False,
                 rest_sockets: list | None = None) -> SearchServer:  # fmt: skip
    """The search server of one process (not bound, not started: :meth:`SearchServer.start` does
    both); the thread settings apply to this process. Raises ValueError for an unreadable items
    file, certificate or token file, or a bind address beyond loopback without TLS and a token
    (:meth:`tfhash.serving.access.Access.check_bind`)."""
    # imported here: the supervising parent of several processes never loads TensorFlow or FAISS
    from tfhash.serving.requests import Limits
    from tfhash.serving.search_service import (
        SearchServer,
        in_process_searcher,
        remote_searcher,
        set_search_threads,
    )

    from tfhash.artifacts import read_items

    items = read_items(options.items_file) if options.items_file else None
    set_search_threads(options.search_threads)  # this thread's too: the first pair's warm-up search runs on it
    if options.tf_threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(options.tf_threads)
        tf.config.threading.set_inter_op_parallelism_threads(options.tf_threads)
    limits = Limits(max_batch=options.max_batch, max_k=options.max_k)
    if options.model_server:
        searcher = remote_searcher(options.model_server, options.model_name, options.index_base_dir, options.kind, limits, options.model_base_dir,
                                   query_modality=options.query_modality, items=items,
                                   credentials=options.model_server_credentials)  # fmt: skip
    else:
        searcher = in_process_searcher(options.model_base_dir, options.index_base_dir, options.kind, limits, options.query_modality, items)
    rest_options = {"header_timeout": options.rest_timeout, "body_timeout": options.rest_timeout}
    if options.image_root:  # the search page (tfhash.serving.page)
        from tfhash.serving.page import ItemImages

        if items is None:
            raise ValueError("--image-root shows the items of --items: pass the data's items.csv too")
        rest_options["images"] = ItemImages(options.image_root, items, storage.parent(options.items_file))
    return SearchServer(searcher, host=options.host, port=options.port, rest_port=options.rest_port, poll_seconds=options.poll_seconds,
                        max_message_bytes=options.max_request_mb << 20, rest_options=rest_options, siblings=siblings,
                        reuse_port=reuse_port, rest_sockets=rest_sockets, search_threads=options.search_threads,
                        event_loop=options.event_loop, access=options.access)  # fmt: skip


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) that its own processes may join: bound
    without ``SO_REUSEPORT`` (BindError if anything holds the port), then marked reusable.

    ``SO_REUSEADDR`` is set, as gRPC and Tornado set it on their sockets: a service restarted after
    a crash binds its port at once instead of waiting out the old connections' TIME_WAIT (60 s on
    Linux); a port with a listener is still refused."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError as err:
        sock.close()
        raise BindError(f"cannot bind {grpc_address(host, port)}: {err}") from err
    return sock


def read_until(process: subprocess.Popen, marker: str, seconds: float) -> tuple[list[str], bool]:
    """The lines of ``process``'s text stderr up to the first that holds ``marker`` (then the last
    line) and whether it came; without it, all it wrote until it exited or was killed ``seconds``
    after the call. The rest of stderr stays for the caller to drain."""
    watchdog = threading.Timer(seconds, process.kill)
    watchdog.start()
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if marker in line:
                return lines, True
    except BaseException:
        process.kill()
        raise
    finally:
        watchdog.cancel()
    return lines, False


def start_command(args: list[str], ready: str, module: str = "tfhash.cli", executable: str = sys.executable) -> tuple[subprocess.Popen, str]:
    """Start ``<executable> -m <module> <args>`` (``tfhash <args>`` by default) and wait for the line
    of its stderr holding ``ready``; returns the process and the address that follows ``ready`` on
    that line. The process keeps its last 400 lines of stderr in ``log`` (drained on a thread) and
    the ready line in ``ready_line``. RuntimeError, with its log, when it exits or takes longer
    than :data:`START_SECONDS` first."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen([executable, "-m", module, *args], stderr=subprocess.PIPE, text=True, env=env)
    lines, started = read_until(process, ready, START_SECONDS)
    process.log = deque(lines, maxlen=400)
    if not started:
        raise RuntimeError(f"{module} {' '.join(args)} did not start (exit code {process.wait(10)}):\n{''.join(process.log)}")
    process.ready_line = process.log[-1]
    process.drain = threading.Thread(target=process.log.extend, args=(process.stderr,), daemon=True)
    process.drain.start()
    return process, process.ready_line.split(ready, 1)[1].split()[0].rstrip(",;")


class ServiceFailed(RuntimeError):
    """The service's processes could not start or kept dying."""


class ProcessFront:
    """``processes`` search-service processes on one gRPC port (and one REST port), supervised
    (below). Constructing it checks the settings and binds nothing; :meth:`start` binds the ports
    (BindError for a port in use), spawns the children and returns once every one serves;
    :meth:`stop` drains them.

    Why several: one process answers one joined call at a time, and its event loop (gRPC's serving,
    parsing) runs on one core at a time (the GIL), so a second core is used by a second process.

    :class:`ProcessFront` holds the ports and supervises; it serves nothing itself.

    * gRPC: the parent binds the port without ``SO_REUSEPORT`` (so a port that any socket holds is
      refused: two services never silently share a port), then sets ``SO_REUSEPORT`` on its bound,
      never listening socket; each child's server binds the same port with ``grpc.so_reuseport`` and
      the kernel spreads connections over the children that listen (a child listens only once it has
      loaded the newest pair there is). Linux lets only sockets of the same user join a port; another
      process of that user asking for ``SO_REUSEPORT`` could join too, so run each service under its
      own user where that matters.
    * REST: the parent opens the listening socket; the children inherit it and accept from it.
    * Status: every child publishes what it serves at each look for a newer pair
      (:mod:`tfhash.serving.shared_status`); health, ``/readyz`` and GetStatus of every child report the
      whole service, ready only while every child is.
    * Versions: each child loads a new version at its own look, and serves it only once every child
      with a fresh status holds it; then all switch together (the ``version`` cell of
      :mod:`tfhash.serving.shared_status`). A response names the version that answered it, no request
      sees two, and a request that starts after any answer named the new version gets it too.
    * Supervision: a child that exits while the service runs is restarted; more than
      ``max_restarts`` exits within ``restart_window`` seconds stop the service with an error (a child
      that cannot stay up is a fault to see, not to hide). A child that fails before it first serves
      stops the start-up with its exit code.
    * SIGTERM / Ctrl-C: forwarded to every child (each in a session of its own), which drains within
      the grace period. A child gets SIGTERM from the kernel when the parent's thread that spawned it
      ends: the parent dying, or its supervisor stopping. A supervisor that fails (no process can be
      spawned) stops the service with an error.
    * Memory: a flat index's codes are mapped from the index files (``load_index(mapped=True)``), one
      copy in the page cache for every process; an IVF index maps its codes and ids too but reads its
      inverted lists into each process, multi-hash and ScaNN indexes build theirs in each process, and
      each process loads its own encoder.

    Args:
        options: what each child serves; ``options.host`` must be a numeric address.
        processes: serving processes (2 or more).
        grace: the grace period on stop.
        max_restarts, restart_window: more exits than ``max_restarts`` within
            ``restart_window`` seconds set :attr:`failed` (:attr:`failure` says why), on which
            :func:`~tfhash.serving.grpc_server.run_until_signal` stops the service.

    Raises:
        ValueError: too few processes, a host name instead of an address, access settings the
            children would refuse (checked here, before any process starts).
    """

    def __init__(self, options: SearchOptions, processes: int, grace: float = 10.0, max_restarts: int = 5,
                 restart_window: float = 60.0):  # fmt: skip
        if processes < 2:
            raise ValueError(f"a process front runs 2 or more processes, got {processes}; serve one with build_server")
        try:
            ipaddress.ip_address(options.host)
        except ValueError as err:
            raise ValueError(f"--processes above 1 needs a numeric bind address (e.g. 127.0.0.1 or 0.0.0.0), got {options.host!r}") from err
        options.access.check_bind(options.host)
        options.access.load()
        self.processes, self.grace = int(processes), float(grace)
        self.max_restarts, self.restart_window = int(max_restarts), float(restart_window)
        self.host, self.port, self.rest_port = options.host, options.port, options.rest_port  # the bound ports once started
        self.options = options
        self._grpc_socket: socket.socket | None = None
        self._rest_sockets: list[socket.socket] = []
        self.status_dir: str | None = None
        self.children: list[subprocess.Popen | None] = [None] * self.processes
        self.failure: str | None = None  # why the service stopped itself
        self.failed = threading.Event()
        self._exits: deque[float] = deque()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._supervisor = threading.Thread(target=self._supervise, name="tfhash-search-supervisor", daemon=True)

    @property
    def address(self) -> str:
        return grpc_address(self.host, self.port)

    def status(self) -> dict:
        """The service's status, as any child would answer GetStatus about every process."""
        return service_status(SharedStatus(self.status_dir, 0, self.processes, self.options.poll_seconds).gather())

    def _spawn(self, slot: int) -> subprocess.Popen:
        withdraw(self.status_dir, slot)
        child = {"options": dataclasses.asdict(self.options), "slot": slot, "processes": self.processes, "status_dir": self.status_dir,
                 "rest_fds": [s.fileno() for s in self._rest_sockets], "grace": self.grace, "parent": os.getpid()}  # fmt: skip
        # a session of its own: a terminal's Ctrl-C reaches the parent only, which stops the children in order
        return subprocess.Popen([sys.executable, "-m", "tfhash.serving.processes", json.dumps(child)],
                                pass_fds=child["rest_fds"], start_new_session=True)  # fmt: skip

    def _bind(self) -> None:
        """Hold the gRPC port (:func:`reserve_port`) and the REST port's listening socket; the
        children's settings name the bound ports. BindError (nothing held) for a port in use."""
        from tfhash.serving.rest import bind_sockets

        options = self.options
        self._grpc_socket = reserve_port(options.host, options.port)
        self.port = self._grpc_socket.getsockname()[1]
        try:
            if options.rest_port is not None:
                self._rest_sockets = bind_sockets(options.host, options.rest_port)
        except BindError:
            self._close_sockets()
            raise
        self.rest_port = self._rest_sockets[0].getsockname()[1] if self._rest_sockets else None
        self.options = dataclasses.replace(options, rest_port=None, port=self.port)
        self.status_dir = tempfile.mkdtemp(prefix="tfhash-search-")

    def start(self) -> ProcessFront:
        """Bind the ports, spawn every child and wait until each one has published its first
        status (it serves).

        Raises:
            tfhash.serving.grpc_server.BindError: a port in use (nothing is left running).
            ServiceFailed: a child exited first (its exit code is named), or did not serve within
                :data:`START_SECONDS`; what was started is stopped.
        """
        if self._grpc_socket is not None:
            raise RuntimeError("this process front was started before; make a new one")
        self._bind()
        with self._lock:
            for slot in range(self.processes):
                self.children[slot] = self._spawn(slot)
        deadline = time.monotonic() + START_SECONDS
        waiting = set(range(self.processes))
        while waiting:
            for slot in list(waiting):
                code = self.children[slot].poll()
                if code is not None:
                    self.stop(0.0)
                    raise ServiceFailed(f"search process {slot} exited with code {code} before it served (its log is above)")
                if os.path.isfile(slot_path(self.status_dir, slot)):
                    waiting.discard(slot)
            if time.monotonic() > deadline:
                self.stop(0.0)
                raise ServiceFailed(f"search processes {sorted(waiting)} did not serve within {START_SECONDS:g} s")
            time.sleep(0.05)
        self._supervisor.start()
        return self

    def _supervise(self) -> None:
        try:
            self._restart_exited()
        except Exception as err:  # noqa: BLE001 - e.g. no process can be spawned: fail loudly, never sit childless
            self.failure = f"supervising the search processes failed: {type(err).__name__}: {err}; stopping the service"
            logger.exception(self.failure)
            self.failed.set()

    def _restart_exited(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                for slot, child in enumerate(self.children):
                    code = child.poll()
                    if code is None or self._stopping.is_set():
                        continue
                    withdraw(self.status_dir, slot)
                    if not self._may_restart(f"search process {slot} (pid {child.pid})", code):
                        return
                    self.children[slot] = self._spawn(slot)

    def _may_restart(self, what: str, code: int) -> bool:
        """Counts an exit; False (and :attr:`failed` set) once there were too many."""
        now = time.monotonic()
        self._exits.append(now)
        while self._exits and self._exits[0] < now - self.restart_window:
            self._exits.popleft()
        if len(self._exits) > self.max_restarts:
            self.failure = (f"search processes exited {len(self._exits)} times within {self.restart_window:g} s "
                            f"(the last: {what}, exit code {code}); stopping the service")  # fmt: skip
            logger.error(self.failure)
            self.failed.set()  # run_until_signal then stops every process
            return False
        logger.error("%s exited with code %s; restarting it", what, code)
        return True

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM every child (each drains for ``grace`` seconds, default :attr:`grace`); kill what
        still runs :data:`EXIT_MARGIN_SECONDS` after the grace period; release the ports."""
        grace = self.grace if grace is None else float(grace)
        self._stopping.set()
        deadline = time.monotonic() + grace + EXIT_MARGIN_SECONDS
        # the supervisor's end would stop the children it restarted (the kernel signals what a thread
        # spawned when that thread ends): it ends first, and then every child is stopped in order
        if self._supervisor.is_alive() and threading.current_thread() is not self._supervisor:
            self._supervisor.join()
        with self._lock:
            children = [c for c in self.children if c is not None]
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for sock in self._rest_sockets:  # new REST connections are refused now, not left in a backlog
            sock.close()
        for child in children:
            _end(child, deadline, f"search process {child.pid}")
        self._close_sockets()
        if self.status_dir is not None:
            shutil.rmtree(self.status_dir, ignore_errors=True)

    def _close_sockets(self) -> None:
        for sock in ([self._grpc_socket] if self._grpc_socket is not None else []) + self._rest_sockets:
            sock.close()


def _end(process: subprocess.Popen, deadline: float, what: str) -> None:
    """Wait for ``process`` (sent SIGTERM) until ``deadline``; kill it then."""
    try:
        process.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        logger.error("%s did not exit within the grace period; killing it", what)
        process.kill()
        process.wait()


def _die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux); exit now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(0)


def child_main(argument: str) -> None:
    """One child of a :class:`ProcessFront` (``python -m tfhash.serving.processes <json>``)."""
    child = json.loads(argument)
    _die_with_parent(child["parent"])
    # as the CLI logs (the service's own events at INFO), each line naming the process's slot
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s search[{child['slot']}] %(name)s %(levelname)s: %(message)s")
    logging.getLogger("tfhash.serving").setLevel(logging.INFO)
    options = SearchOptions.from_json(child["options"])
    sockets = []
    for fd in child["rest_fds"]:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        sockets.append(sock)
    siblings = SharedStatus(child["status_dir"], child["slot"], child["processes"], options.poll_seconds)
    server = build_server(options, siblings, reuse_port=True, rest_sockets=sockets or None)
    run_until_signal(server, child["grace"], exit_within=EXIT_SECONDS)


if __name__ == "__main__":
    child_main(sys.argv[1])
