"""Errors that tell the user what to do say something true about their input (ux20): advice written for one
caller (`partition again`, "pipelines of different shapes") was printed for others where it was false."""

from __future__ import annotations

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.export import export_text
from hetpart.passes.manager import check_dump_dir
from hetpart.runtime.checkpoint import check_checkpoint_dir


def test_a_file_at_the_checkpoint_dir_asks_for_another_dir_not_a_new_partition(tmp_path):
    ck = tmp_path / "notes.txt"
    ck.write_text("mine")
    with pytest.raises(HetpartError, match="is not a directory") as err:
        check_checkpoint_dir(ck, 0, 2, 1)
    assert "pass another --checkpoint-dir" in str(err.value) and "partition again" not in str(err.value)
    assert ck.read_text() == "mine"


def test_a_file_at_dump_ir_asks_for_another_dir_not_a_new_partition(tmp_path, capsys):
    where = tmp_path / "notes.txt"
    where.write_text("mine")
    with pytest.raises(HetpartError, match="is not a directory") as err:
        check_dump_dir(where)
    assert "choose another --dump-ir DIR" in str(err.value) and "partition again" not in str(err.value)
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2",
                 "--no-pt2", "--out", str(out), "--dump-ir", str(where)]) == 2
    assert "choose another --dump-ir DIR" in capsys.readouterr().err
    assert where.read_text() == "mine" and not out.exists()


@pytest.mark.parametrize("devices", [[["d0", "d1", "d2"]], [["d0", "d1"], ["d2", "d3"]]])
def test_export_of_a_pipelines_plan_does_not_call_its_pipelines_different(devices):
    """A `--parallel data` answer of one pipeline, or of stripes (pipelines of the same shape), was refused as
    "1 data-parallel pipelines of different shapes"."""
    pj = {"pipelines": [{"index": i, "devices": d, "microbatches": 2} for i, d in enumerate(devices)]}
    with pytest.raises(HetpartError) as err:
        export_text(pj, "megatron")
    text = str(err.value)
    assert "different shapes" not in text and f"({len(devices)} pipeline" in text
    assert "1 pipelines" not in text
