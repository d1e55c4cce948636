"""The one exception users see: what was wrong, where, and what to do.

Every module raises `HetpartError` for a user's mistake (bad input, an
impossible request); the CLI prints its message without a traceback and exits
with status 2. Anything else escaping is a bug in hetpart.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from pathlib import Path

# The advice where a file `partition` wrote is missing, edited or damaged: `partition` into the same --out again.
# That replaces an existing directory only with --force (NOTE [what --force replaces]); without it the advice failed
# as printed ("output directory ... already exists", ux21). `redo_into` names the directory where it is known.
REDO_PARTITION = ("re-run `hetpart partition` with the model and flags that wrote it, the same --out and --force "
                  "(it replaces a directory hetpart wrote)")


def redo_into(out: Path) -> str:
    """REDO_PARTITION for the artifacts directory `out`, named as a command."""
    return (f"re-run `hetpart partition ... --out {shlex.quote(str(out))} --force` with the model and flags that "
            "wrote it (--force: it replaces that directory, which hetpart wrote)")


class HetpartError(Exception):
    """A user-facing error. `str(err)` is the whole message."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`) or SIGHUP (the terminal closed) as an exception, raised by the
    CLI's handler, so that every `finally` cleans up: the staging directory, the lock and created
    folders of `partition`, the torchruns of `run` (which lead sessions of their own: the default
    SIGHUP would leave them running). Code that turns the user's BaseExceptions into errors lets
    it through."""

    def __init__(self, signum: int = 15) -> None:  # 15: SIGTERM
        super().__init__(signum)
        self.signum = signum


def did_you_mean(word: str, known: Iterable[str], prefix: str = "") -> str:
    """`; did you mean X?` for the close matches of `word` among `known` (difflib), each shown with
    `prefix` (`preset:`, `zoo:`); "" when nothing is close.

        >>> did_you_mean("mixed4", ["mixed-4", "cpu-2"], "preset:")
        '; did you mean preset:mixed-4?'
    """
    import difflib

    close = difflib.get_close_matches(word, list(known), n=3)
    return f"; did you mean {' or '.join(prefix + c for c in close)}?" if close else ""
