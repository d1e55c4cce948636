"""A rank's start-up imports (hetpart/shards.py's docstring): every torchrun rank
imports hetpart.runtime.worker, so what it pulls in is paid once per rank per launch. Importing hetpart.codegen (its
package imports export, passes, partitioner, models, ortools) added 0.3-0.6 CPU-s to each of the suite's ~200 rank
starts when checkpoint_slices imported a helper from it at module level. The same holds for what a rank imports on
the way: an inference rank's boundary dtypes, a checkpoint's shard layouts, --verify's gathered shards each imported
a package of the compiler inside the function (0.4-0.8 CPU-s a rank); they read hetpart.ir.info and hetpart.shards."""

import json
import subprocess
import sys

import pytest

# The steps before the runtime: a rank runs generated files, it does not trace, plan or generate them.
_NOT_AT_START = ("hetpart.codegen", "hetpart.partitioner", "hetpart.passes", "hetpart.models", "hetpart.frontend",
                 "hetpart.export", "ortools")
_PRINT = "; print(json.dumps(sorted(sys.modules)))"
# What a rank does on its way (the second test's claim), after its start-up imports (the first test's).
_ON_ITS_WAY = (
    "import torch; from hetpart.runtime import checkpoint_slices as cs, tp; "
    # an inference rank's boundary metadata (the manifest's dtype names mapped back to torch's)
    "meta = w._static_metadata({}, {'inputs': [{'shape': ['2'], 'dtype': 'bf16'}]}, {}, torch.device('cpu'), "
    "sent=[]); assert meta['input_args'][0].dtype == torch.bfloat16, meta; "
    # a TP rank's checkpoint layouts: TP rank 1 of 2 holds rows 4..8 of the whole
    "lay = cs.saved_layouts({'weight/a': torch.zeros(4, 3)}, {'a': {'dim': 0, 'chunks': 1, 'rank': 1, "
    "'degree': 2}}); assert lay['weight/a'].pieces == ((4, 8),), lay; "
    # the whole weights --verify reads, from each TP rank's part
    "man = {'format_version': 2, 'mesh': {'tensor_parallel': [{'ranks': [0, 1], 'weights': "
    "{'a': {'dim': 1, 'chunks': 1}}}]}}; "
    "whole = tp.whole_weights([{'a': torch.zeros(2, 1)}, {'a': torch.ones(2, 1)}], man); "
    "assert whole[0]['a'].tolist() == [[0.0, 1.0], [0.0, 1.0]], whole")


def _compiler_modules(loaded: list[str]) -> list[str]:
    assert "hetpart.runtime.worker" in loaded  # the probe itself works
    return [m for m in loaded if m.split(".")[0] == "ortools" or m.startswith(_NOT_AT_START[:-1])]


@pytest.fixture(scope="module")
def rank_modules() -> tuple[list[str], list[str]]:
    """The modules of one fresh process (a rank's start-up costs 3-4 CPU-s, so both tests read one): after `import
    hetpart.runtime.worker` alone, and after the steps of `_ON_ITS_WAY` too."""
    code = "import json, sys; import hetpart.runtime.worker as w" + _PRINT + "; " + _ON_ITS_WAY + _PRINT
    lines = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.splitlines()
    return json.loads(lines[-2]), json.loads(lines[-1])


def test_a_rank_imports_none_of_the_compiler_at_start_up(rank_modules):
    assert not _compiler_modules(rank_modules[0])


def test_a_rank_imports_none_of_the_compiler_for_boundaries_checkpoints_or_verify(rank_modules):
    assert "torch" in rank_modules[1] and not _compiler_modules(rank_modules[1])
