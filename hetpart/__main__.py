"""`python -m hetpart ...`, the same as the `hetpart` script.

NOTE [python -m and the working directory]: `python -m` puts the working directory first on
sys.path, so from inside an artifacts directory (or any directory someone else could write) a
planted `torch.py` would be imported by hetpart's first `import torch`. By the time this runs,
hetpart itself is imported (from the install, or from the directory, where that is where it
lives: its submodules then come from the package's own path, not sys.path), but nothing else
of hetpart's is: dropping the working directory's entry here keeps every later import out of
it. `python -P -m hetpart` (or PYTHONSAFEPATH=1) leaves it off from the start, and the
`hetpart` script never adds it: the README's trust model prefers those.
"""

import os
import sys


def _drop_working_directory() -> None:
    """Remove the entry `python -m` put first on sys.path when it is the working directory."""
    if getattr(sys.flags, "safe_path", False) or not sys.path:
        return
    first = sys.path[0]
    try:
        here = os.getcwd() if first else ""
    except OSError:  # the working directory is gone: nothing can be imported from it
        return
    if first == "" or os.path.realpath(first) == os.path.realpath(here):
        del sys.path[0]


_drop_working_directory()

from hetpart.cli import main  # noqa: E402 - after the working directory is off sys.path

sys.exit(main())
