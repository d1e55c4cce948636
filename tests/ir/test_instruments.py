"""PassManager instruments: dumps kept in --dump-ir DIR when a pass fails, timings, progress hook."""

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.passes import PassContext, PassManager, PassResult


@dataclass(frozen=True)
class _Renames:
    name: ClassVar[str] = "renames"
    summary: ClassVar[str] = "a no-op that reports no change"
    requires: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()

    def run(self, gm, ctx):
        return PassResult(gm, False)


@dataclass(frozen=True)
class _Fails:
    name: ClassVar[str] = "fails"
    summary: ClassVar[str] = "raises a user error"
    requires: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ()

    def run(self, gm, ctx):
        raise HetpartError("this model has no ops I know")


def _gm() -> fx.GraphModule:
    return fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))


def test_dumps_written_so_far_survive_a_failing_pass(tmp_path):
    lines, started = [], []
    pm = PassManager([_Renames(), _Fails()], extra_dump_dir=tmp_path / "dumps", echo=lines.append, verbose=True,
                     on_pass_start=started.append)
    with pytest.raises(HetpartError, match="pass 'fails': this model has no ops I know"):
        pm.run(_gm(), PassContext())
    assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == [".hetpart-dumps", "00-export.txt",
                                                                       "01-renames.txt", "graph.json"]
    assert started == ["pass 01 renames", "pass 02 fails"]
    assert len(lines) == 1 and lines[0].startswith("pass 01 renames: ") and lines[0].endswith(" ms")


def test_unwritable_dump_dir_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(HetpartError, match="cannot write IR dumps to .*--dump-ir DIR"):
        PassManager([_Renames()], extra_dump_dir=blocker / "ir").run(_gm(), PassContext())
