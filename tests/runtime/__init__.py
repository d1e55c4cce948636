"""Helpers the runtime tests share."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path


def edited_copy(out: Path, to: Path, edit: Callable[[dict], object]) -> Path:
    """A copy of artifacts directory `out` at `to`, its manifest.json changed by `edit` (the files' hashes left
    as they were: what `load_manifest` must refuse)."""
    man = json.loads((out / "manifest.json").read_text())
    edit(man)
    shutil.copytree(out, to)
    (to / "manifest.json").write_text(json.dumps(man))
    return to
