"""What the ``tfhash`` command prints: the logging and warnings set at its entry, and its errors.

By default (:func:`setup_console`) a run shows what a user reads: TensorFlow's C++ log and the
libraries' notices are off, and TFX's log is one line per pipeline component
(:class:`PipelineProgress`); ``-v`` and ``-vv`` bring everything back. A failing command ends with
one ``Error: <message>`` line on stderr and exits with 2 on bad input (:class:`BadInput`), 1 on
any other failure.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import warnings

import click

from tfhash import startup

__all__ = ["BadInput", "PipelineProgress", "setup_console"]


#: Prefix of the progress lines on stderr, as in ``tfhash pipeline run``'s own lines.
PREFIX = "[tfhash] "
#: Third-party log messages (their beginnings) that are expected in a tfhash pipeline run and say
#: nothing to its user; they repeat at every component that resolves inputs.
HARMLESS = (
    # ML Metadata's SQLite store answers the resolvers' artifact queries without this filter.
    "ArtifactQuery.property_predicate is not supported",
    # Transform's output artifact names no payload format; its records are tf.Examples, which is
    # what TFX falls back to.
    "Examples artifact does not have payload_format custom property",
)
#: TensorFlow's deprecation notices (logger ``tensorflow``) about calls inside the libraries
#: (tfx_bsl's record parsing, for one): nothing a user of tfhash can act on.
TF_DEPRECATION = re.compile(r"is deprecated and will be removed")
#: Python warnings ignored by default, beyond those importing tfhash holds back
#: (:mod:`tfhash.startup`): (category, module, message), the last two regular expressions matched
#: at the start of the warning's module and text.
QUIET_WARNINGS = (
    # Keras at the end of the first epoch of a dataset without a stated length (the Trainer's):
    # the epoch ended where the data did, as intended.
    (UserWarning, r"keras(\.|$)", "Your input ran out of data"),
)
_COMPONENT = re.compile(r"Component (?P<node>\S+) is (?P<state>running|finished)\.$")
_CACHED = re.compile(r"A cached execution \d+ is used\.$")


class BadInput(click.ClickException):
    """A command refuses its input: a file, a value or a combination of settings. click prints
    ``Error: <message>`` and exits with 2, the code of its own usage errors, so that every command
    of ``tfhash`` reports bad input alike. Raise it ``from`` the library's error, whose message
    names the value and the fix.

    The line on stderr is click's ``Error: <message>`` (a usage error has the usage above it).
    ``click.UsageError`` and ``click.BadParameter`` exit with 2 as well; a failure outside the
    command's input (``click.ClickException``: a port in use, an unreachable service, a missing
    optional package) exits with 1."""

    exit_code = 2


class PipelineProgress(logging.Filter):
    """A filter for the ``absl`` logger: LocalDagRunner's "Component X is running." and "Component
    X is finished." become one line per component on ``stream`` (the component's name and its
    wall time, ``(cached)`` when TFX reused an earlier execution); its other records below WARNING
    and the warnings of :data:`HARMLESS` are dropped.

    A line reads ``[tfhash] <component> <seconds> s``, with :data:`PREFIX` in front; any other
    warning or error passes the filter and still shows."""

    def __init__(self, stream=None) -> None:
        super().__init__()
        self.stream = stream
        self._started: dict[str, float] = {}
        self._cached: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        component = _COMPONENT.match(message)
        if component:
            node = component["node"]
            if component["state"] == "running":
                self._started[node] = time.perf_counter()
            else:
                self._finished(node)
            return False
        if _CACHED.match(message) and self._started:
            self._cached.add(next(reversed(self._started)))
            return False
        if record.levelno < logging.WARNING:
            return False
        return not message.startswith(HARMLESS)

    def _finished(self, node: str) -> None:
        started = self._started.pop(node, None)
        elapsed = f"{time.perf_counter() - started:7.1f} s" if started is not None else "      ? s"
        cached = " (cached)" if node in self._cached else ""
        self._cached.discard(node)
        stream = self.stream or sys.stderr
        stream.write(f"{PREFIX}{node:<32}{elapsed}{cached}\n")
        stream.flush()


class DropMessages(logging.Filter):
    """A logger filter that drops the records whose message ``pattern`` finds."""

    def __init__(self, pattern: re.Pattern) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


_installed: list[tuple[logging.Logger, logging.Filter]] = []


def setup_console(verbose: int = 0) -> None:
    """Set logging and warnings for a command-line run: quiet (``verbose=0``) or everything at INFO
    (1) / DEBUG (2 or more). Call it before TensorFlow is imported; calling it again replaces the
    earlier setting.

    Quiet, a run shows what a user reads:

    * What importing tfhash holds back stays held back (:func:`tfhash.startup.hold_back`):
      TensorFlow's C++ log (CUDA plugin registration on a CPU machine, TensorRT, oneDNN and
      CPU-feature notices), unless the environment sets its level, and the ``google.*`` client
      libraries' ``FutureWarning``\\ s. TensorFlow reads its level once, when it is first imported,
      so this runs before any command imports TensorFlow (the command line's modules import it only
      inside the commands).
    * The Python warnings of :data:`QUIET_WARNINGS` are ignored: Keras's note that an epoch ended
      where the data did.
    * TFX's absl log is reduced to one line per pipeline component by :class:`PipelineProgress`;
      TensorFlow's deprecation notices about calls inside the libraries (:data:`TF_DEPRECATION`)
      are dropped.

    The Keras epoch lines and the command's own output are untouched. At INFO or DEBUG nothing
    above is set or filtered, and the absl and Python logs go to stderr at that level."""
    from absl import logging as absl_logging

    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    logging.getLogger().setLevel(level)
    while _installed:
        logger, installed = _installed.pop()
        logger.removeFilter(installed)
    # LocalDagRunner's component records are INFO. Set through absl's verbosity flag, not the
    # logger's level: a component that parses absl's flags (Transform does) resets the logger's
    # level from the flag.
    absl_logging.set_verbosity(absl_logging.DEBUG if verbose >= 2 else absl_logging.INFO)
    if verbose > 0:
        startup.let_through()
        return
    startup.hold_back()
    for category, module, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, quiet in (("absl", PipelineProgress()), ("tensorflow", DropMessages(TF_DEPRECATION))):
        logging.getLogger(name).addFilter(quiet)
        _installed.append((logging.getLogger(name), quiet))
