"""The serving benchmark's C++ load generator (``loadgen.cc``), built on first use against the
system's gRPC C++ library: a benchmark tool only (the package compiles nothing, and the set-up
installs no compiler); without it the benchmark's Python load generator runs.

Building needs g++, pkg-config and gRPC's C++ library (Debian / Ubuntu: ``apt-get install g++
pkg-config libgrpc++-dev``). A binary is kept in :func:`cache_dir` under a name that hashes its
source, the flags and the library's version, so it is built once per machine and rebuilt when
any of them changes; the build writes a temporary file and renames it, so processes that build
at once never see half a binary. A cached binary runs only if this user owns it and nobody else
may write it.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile

#: The folder of the C++ sources.
HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL_HINT = "apt-get install g++ pkg-config libgrpc++-dev"

logger = logging.getLogger(__name__)


class BuildFailed(RuntimeError):
    """A C++ program could not be built (the message names what is missing and how to install it)."""


def missing() -> str | None:
    """What building needs and this machine lacks (``None``: nothing)."""
    tools = [tool for tool in ("g++", "pkg-config") if shutil.which(tool) is None]
    if tools:
        return " and ".join(tools) + " not found"
    if subprocess.run(["pkg-config", "--exists", "grpc++"], check=False).returncode != 0:
        return "gRPC's C++ library (pkg-config grpc++) not found"
    return None


def cache_dir() -> str:
    """Where built programs are kept: ``$TFHASH_CACHE_DIR``, else ``$XDG_CACHE_HOME/tfhash``, else
    ``~/.cache/tfhash``; its ``bin`` folder."""
    root = os.environ.get("TFHASH_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfhash")
    return os.path.join(root, "bin")


@functools.cache
def build(source: str, optimise: str = "-O2") -> str:
    """The path of ``source`` (a ``.cc`` file) built with ``optimise``, building it if it is not
    in :func:`cache_dir` yet (looked up once per process: each benchmark run asks again).

    Raises:
        BuildFailed: a tool or the library is missing, or the compiler failed (its output is in
            the message).
    """
    lack = missing()
    if lack:
        raise BuildFailed(f"building {os.path.basename(source)} needs g++, pkg-config and gRPC's C++ library: {lack} "
                          f"(Debian / Ubuntu: {INSTALL_HINT})")  # fmt: skip
    flags, version = _pkg_config("--cflags", "--libs").split(), _pkg_config("--modversion").strip()
    with open(source, "rb") as file:
        digest = hashlib.sha256(file.read() + " ".join([optimise, version, *flags]).encode()).hexdigest()[:16]
    name = os.path.splitext(os.path.basename(source))[0]
    binary = os.path.join(cache_dir(), f"{name}-{digest}")
    if os.path.isfile(binary):
        _check_owned(binary)
        return binary
    os.makedirs(cache_dir(), mode=0o755, exist_ok=True)
    _check_owned(cache_dir())
    logger.info("building %s against gRPC %s (once for this machine; about a minute)", os.path.basename(source), version)
    handle, partial = tempfile.mkstemp(prefix=f".{name}-", dir=cache_dir())
    os.close(handle)
    try:
        done = subprocess.run(["g++", *optimise.split(), "-std=c++17", source, "-o", partial, *flags], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildFailed(f"building {source} failed (g++ exit code {done.returncode}):\n{done.stderr[:4000]}")
        os.chmod(partial, 0o755)
        os.replace(partial, binary)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return binary


def _pkg_config(*args: str) -> str:
    done = subprocess.run(["pkg-config", *args, "grpc++"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildFailed(f"pkg-config {' '.join(args)} grpc++ failed: {done.stderr.strip()} (Debian / Ubuntu: {INSTALL_HINT})")
    return done.stdout


def _check_owned(path: str) -> None:
    """Refuses a cached binary (or the cache folder) that another user owns or may write: the
    service would run whatever is there."""
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise BuildFailed(f"{path} is not this user's own (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}): "
                          "remove it, or set TFHASH_CACHE_DIR to a folder of your own")  # fmt: skip
