"""A rank's start-up imports (NOTE in hetpart/runtime/checkpoint_slices.py `saved_layouts`): every torchrun rank
imports hetpart.runtime.worker, so what it pulls in is paid once per rank per launch. Importing hetpart.codegen (its
package imports export, passes, partitioner, models, ortools) added 0.3-0.6 CPU-s to each of the suite's ~200 rank
starts when checkpoint_slices imported a helper from it at module level."""

import json
import subprocess
import sys

# The steps before the runtime: a rank runs generated files, it does not trace, plan or generate them.
_NOT_AT_START = ("hetpart.codegen", "hetpart.partitioner", "hetpart.passes", "hetpart.models", "hetpart.frontend",
                 "hetpart.export", "ortools")


def test_a_rank_imports_none_of_the_compiler_at_start_up():
    code = ("import json, sys; import hetpart.runtime.worker; "
            "print(json.dumps(sorted(m for m in sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    assert "hetpart.runtime.worker" in loaded  # the probe itself works
    assert not [m for m in loaded if m.split(".")[0] == "ortools" or m.startswith(_NOT_AT_START[:-1])]
