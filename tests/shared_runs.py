"""Torchrun launches that several tests read: the helpers behind tests/conftest.py's session fixtures.

NOTE [shared launches]: a torchrun launch costs 8-25 s of the suite (torchrun and every rank import
torch), most of it start-up, not the check. Where tests of different files check different things of
the same run, the run happens once, in a session fixture of tests/conftest.py, and each test asserts
its own part of what the partition and the run printed and wrote. A test that changes the directory
works on a copy (shutil.copytree); a fixture's run is never repeated to get another output.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

# gpt-small on two CPUs: two stages, the LM head tied to the embedding (the weight lives on both ranks).
GPT_CPU2 = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
            "--set", "block_size=32", "--cluster", "preset:cpu-2", "--batch-size", "4", "--seq-len", "16",
            "--microbatches", "2", "--no-pt2"]  # the ranks run stage.py, never stage.pt2


@dataclass(frozen=True)
class SharedRun:
    """An artifacts directory, what `hetpart partition` printed for it, and what one `hetpart run` printed."""

    out: Path
    partition_text: str
    run_text: str


def cli_output(argv: list[str]) -> str:
    """stdout of `hetpart ARGV` run in this process (status 0 asserted, with the output on failure)."""
    from hetpart.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    assert code == 0, (argv, buf.getvalue())
    return buf.getvalue()
