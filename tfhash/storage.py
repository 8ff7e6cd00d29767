"""Where a file lives: a local path, or a URI of remote storage (``gs://``, ``s3://``, any scheme
``tf.io.gfile`` knows), read and written through one set of functions.

Local paths go through the standard library, as they always did: nothing heavy is imported, and a
write is atomic (a temporary sibling renamed into place). URIs go through ``tf.io.gfile``, and are
never turned into local paths: an object store makes an object visible whole when its upload ends,
and a folder is published by writing its marker file (a manifest) last (:func:`copy_tree`). What
must be a local file (a memory map, an SQLite database) is a local copy (:func:`local_copy`) or lives
in the local cache folder (:func:`cache_dir`). This module imports no other tfhash module.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import uuid

__all__ = ["NO_SPACE", "space_reported", "is_uri", "check_scheme", "join", "resolve", "parent", "basename", "isdir", "isfile", "listdir", "glob", "makedirs", "remove",
           "rmtree", "read_bytes", "read_text", "read_json", "write_bytes", "write_text", "write_json", "files_under",
           "copy_tree", "local_copy", "cache_dir", "key_of", "staging_folder"]  # fmt: skip

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")  # two letters at least: not a Windows drive


def is_uri(path) -> bool:
    """Whether ``path`` names remote storage (``<scheme>://...``) rather than a local file."""
    return isinstance(path, str) and bool(_SCHEME.match(path))


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


@contextlib.contextmanager
def _remote(path):
    """TensorFlow's errors on ``path`` as the standard library's: NotFound as FileNotFoundError, a
    refused or missing credential as PermissionError, any other as OSError, each naming the path."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.NotFoundError as err:
        raise FileNotFoundError(f"{path}: no such object") from err
    except (tf.errors.PermissionDeniedError, tf.errors.UnauthenticatedError) as err:
        raise PermissionError(f"{path}: access refused ({_first_line(err)}); check the credentials this process runs with "
                              "(Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, or the pod's workload identity)") from err
    except tf.errors.OpError as err:
        raise OSError(f"{path}: {_first_line(err)}") from err


def _first_line(err) -> str:
    return (getattr(err, "message", "") or str(err)).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__


#: What to install for a scheme that TensorFlow has no file system for (TensorFlow 2.16 has ``gs://``).
SCHEME_PACKAGES = {"s3": "tensorflow-io==0.37.* (TensorFlow's S3 file system) and apache-beam[aws] (Beam's)",
                   "hdfs": "tensorflow-io==0.37.* (TensorFlow's HDFS file system)"}  # fmt: skip


def check_scheme(path) -> None:
    """Refuse a URI whose scheme TensorFlow has no file system for here, with what to install;
    a local path passes.

    Raises:
        ValueError: the scheme is unknown to ``tf.io.gfile``.
    """
    if not is_uri(path):
        return
    import tensorflow as tf

    try:
        tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError as err:
        scheme = path.split("://", 1)[0]
        hint = SCHEME_PACKAGES.get(scheme, "the package that registers it with tf.io.gfile")
        raise ValueError(f"{path}: TensorFlow has no file system for {scheme}:// here; install {hint}") from err
    except tf.errors.OpError as err:
        raise ValueError(f"cannot reach {path}: {_first_line(err)} (check the storage's address and the credentials this "
                         "process runs with)") from err


def join(base, *parts: str) -> str:
    """``base`` and ``parts`` joined with ``/`` for a URI, by :func:`os.path.join` for a path."""
    if is_uri(base):
        return "/".join([base.rstrip("/"), *(str(p).strip("/") for p in parts)])
    return os.path.join(os.fspath(base), *parts)


def resolve(base, value: str | None) -> str | None:
    """A location from a config file: a URI or an absolute path as given, a relative path against
    ``base`` (the file's folder; a URI base joins it); None or empty stays as it is. A URI loses a
    trailing ``/``, so one location has one spelling."""
    if is_uri(value):
        return value.rstrip("/")
    if not value or os.path.isabs(value):
        return value
    if is_uri(base):
        return join(base, value)
    return os.path.realpath(os.path.join(os.fspath(base), value))


def parent(path) -> str:
    """The folder (or URI) that holds a file; a local one made absolute."""
    if is_uri(path):
        return str(path).rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(path))


def basename(path) -> str:
    """The last part of a path or URI."""
    return str(path).rstrip("/").rsplit("/", 1)[-1] if is_uri(path) else os.path.basename(path)


def _kind(path) -> str | None:
    """``"dir"``, ``"file"`` or None (nothing there) of a URI; an error reaching it raises
    (``tf.io.gfile.isdir`` alone reads any error as "not a folder": a storage fault would look like
    an empty folder)."""
    gfile = _gfile()
    with _remote(path):
        if gfile.isdir(path):
            return "dir"
        return "file" if gfile.exists(path) else None


def isdir(path) -> bool:
    """Whether ``path`` is a folder (for a URI: a name prefix of objects). An error reaching remote
    storage raises OSError rather than answer False."""
    return _kind(path) == "dir" if is_uri(path) else os.path.isdir(path)


def isfile(path) -> bool:
    """Whether ``path`` is a file (for a URI: an object that is not a folder); errors as :func:`isdir`."""
    return _kind(path) == "file" if is_uri(path) else os.path.isfile(path)


def listdir(path) -> list[str]:
    """The names directly under a folder, sorted (a URI's without the trailing ``/`` of sub-folders)."""
    if is_uri(path):
        with _remote(path):
            return sorted({name.rstrip("/") for name in _gfile().listdir(path)})
    return sorted(os.listdir(path))


def glob(pattern: str) -> list[str]:
    """The files matching ``pattern``, sorted."""
    if is_uri(pattern):
        with _remote(pattern):
            return sorted(_gfile().glob(pattern))
    import glob as local_glob

    return sorted(local_glob.glob(pattern))


def makedirs(path) -> None:
    """Create a folder and its parents (nothing to do for an object store, whose folders are the
    objects' name prefixes, but ``tf.io.gfile`` writes a marker, which does no harm)."""
    if is_uri(path):
        with _remote(path):
            _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def remove(path) -> None:
    """Remove a file; a missing one is not an error."""
    if not is_uri(path):
        if os.path.lexists(path):
            os.remove(path)
        return
    try:
        with _remote(path):
            _gfile().remove(path)
    except FileNotFoundError:
        pass


def rmtree(path) -> None:
    """Remove a folder and everything under it; a missing one is not an error."""
    if not is_uri(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        with _remote(path):
            _gfile().rmtree(path)
    except FileNotFoundError:
        pass


def read_bytes(path) -> bytes:
    """The whole file. A missing one raises FileNotFoundError, path or URI alike; another error
    reaching remote storage raises OSError naming the URI."""
    if not is_uri(path):
        with open(path, "rb") as handle:
            return handle.read()
    with _remote(path), _gfile().GFile(path, "rb") as handle:
        return handle.read()


def read_text(path) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path):
    return json.loads(read_text(path))


#: The errors of a write that found no room: the disk full, a quota, the file-size limit.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
#: How NumPy reports a short write of an array to a file (an OSError without errno).
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")


@contextlib.contextmanager
def space_reported(path, what: str):
    """Turn a write that found no room (:data:`NO_SPACE`) into an OSError of the same errno that
    names ``what``, the ``path``, the space left on its filesystem and the fix (the caller removes
    what it staged; nothing is left where a reader looks)."""
    try:
        yield
    except OSError as err:
        if err.errno not in NO_SPACE and not (err.errno is None and _SHORT_WRITE.match(str(err))):
            raise
        code = err.errno or errno.ENOSPC
        folder = os.path.abspath(str(path))
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        free = shutil.disk_usage(folder).free
        raise OSError(code, f"no room to write {what} {path}: {os.strerror(code)} ({free / 2**20:.1f} MiB free on its "
                                 "filesystem); nothing was put in place, the version before stays. Free space (or raise the "
                                 "file-size limit) and write it again") from err  # fmt: skip


def write_bytes(path, data: bytes) -> None:
    """Write a whole file so that a reader sees the old one or the new one, never a part: a local
    file under a temporary sibling name renamed into place; an object in one upload. Its folder is
    created when missing."""
    if is_uri(path):
        with _remote(path), _gfile().GFile(path, "wb") as handle:
            handle.write(data)
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    staging = os.path.join(folder, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
    try:
        with space_reported(path, "the file"), open(staging, "wb") as handle:
            handle.write(data)
        os.replace(staging, path)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise


def write_text(path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path, value) -> None:
    write_text(path, json.dumps(value, indent=2))


def files_under(path) -> list[tuple[str, int, int]]:
    """``(relative path, size, modification time in ns)`` of every file under a folder (a file
    path: the file itself, relative path ``""``), sorted; a missing path holds none. A file removed
    while the folder is read is left out."""
    if is_uri(path):
        gfile, kind = _gfile(), _kind(path)
        if kind is None:
            return []
        if kind == "file":
            with _remote(path):
                info = gfile.stat(path)
            return [("", info.length, info.mtime_nsec)]
        found = []
        with _remote(path):
            walked = [(folder, names) for folder, _, names in gfile.walk(path)]
        for folder, names in walked:
            for name in names:
                full = join(folder, name)
                try:
                    with _remote(full):
                        info = gfile.stat(full)
                except FileNotFoundError:  # removed while we walked: the next look tells
                    continue
                found.append((full[len(path.rstrip("/")) + 1:], info.length, info.mtime_nsec))
        return sorted(found)
    if os.path.isfile(path):
        info = os.stat(path)
        return [("", info.st_size, info.st_mtime_ns)]
    found = []
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            try:
                info = os.stat(full)
            except OSError:
                continue
            found.append((os.path.relpath(full, path), info.st_size, info.st_mtime_ns))
    return sorted(found)


def copy_tree(source, target, last: str | None = None, names: list[str] | None = None) -> None:
    """Copy every file under the folder ``source`` (or the relative ``names`` of them) to the same
    place under ``target`` (either may be a URI), the file named ``last`` (e.g. a manifest, which
    says the folder is complete) after all the others, so a reader that waits for it never sees a
    part."""
    names = [name for name, _, _ in files_under(source)] if names is None else names
    if "" in names:
        raise ValueError(f"{source} is a file, not a folder to copy")
    for name in sorted(names, key=lambda n: (n == last, n)):
        write_bytes(join(target, *name.split(os.sep)), read_bytes(join(source, *name.split(os.sep))))


def cache_dir(*parts: str) -> str:
    """A folder of this machine for what must be local when the data are remote (local copies,
    ML Metadata of a remote run): ``$TFHASH_CACHE_DIR``, else ``$XDG_CACHE_HOME/tfhash``, else
    ``~/.cache/tfhash``; created when missing."""
    root = os.environ.get("TFHASH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfhash")
    folder = os.path.join(root, *parts)
    os.makedirs(folder, exist_ok=True)
    return folder


def staging_folder(folder, prefix: str) -> str:
    """A new empty folder in the local ``folder`` to write a result into before renaming it into
    place, named ``<prefix><host>-<pid>-<random>``. Staging folders of ``prefix`` that a process of
    this host left when it died without cleaning up (killed, out of memory, the machine stopped) are
    removed first: a half-written trunk cache or 100M-code index weighs gigabytes, and the next
    build's free-space check would count against it. A live process's folder and another host's
    (a shared file system) are kept."""
    host = socket.gethostname().replace(os.sep, "_")
    mine = f"{prefix}{host}-"
    for name in os.listdir(folder):
        pid = name[len(mine):].split("-", 1)[0] if name.startswith(mine) else ""
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{mine}{os.getpid()}-", dir=folder)


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def key_of(text: str) -> str:
    """A short stable name for ``text`` (a URI) in the local cache."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def local_copy(path, kind: str = "copies", fresh: bool = False) -> str:
    """A local folder with the files of the folder ``path``: ``path`` itself when it is local; for a
    URI, a copy under :func:`cache_dir` named by the URI and its files' sizes and times, downloaded
    once and renamed into place whole. Processes that ask for the same URI take turns (a lock file
    beside the copies), so one downloads and the others find its copy. Older copies of the URI are
    removed then (a process still mapping one keeps its files until it unmaps them). ``fresh``:
    download again even when a copy of these sizes and times exists (one found corrupt, or from a
    store whose times do not change on a rewrite).

    Raises:
        FileNotFoundError: a URI with no files under it.
        ValueError: a URI of one file.
    """
    if not is_uri(path):
        return os.fspath(path)
    import fcntl

    files = files_under(path)
    if not files:
        raise FileNotFoundError(f"{path}: no files under this URI")
    uri_key = key_of(path.rstrip("/"))
    folder = cache_dir(kind)
    target = os.path.join(folder, f"{uri_key}-{key_of(json.dumps(files))}")
    with open(os.path.join(folder, f".{uri_key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(target) and not fresh:
            return target
        staging = staging_folder(folder, f".{uri_key}.tmp-")
        try:
            copy_tree(path, staging, names=[name for name, _, _ in files])
            shutil.rmtree(target, ignore_errors=True)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for name in os.listdir(folder):
            if name.startswith(f"{uri_key}-") and name != os.path.basename(target):
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    return target
