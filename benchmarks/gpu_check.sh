#!/usr/bin/env bash
# Per-stage predicted (roofline and profile) vs measured times of generated stages on one GPU (issue 22).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        # on a machine with a CUDA GPU; under 8 minutes
#
# UNTESTED: no GPU was lent in the session that wrote it. It needs no network: it uses
# $PYTHON (default .venv/bin/python, else python3) and checks that its torch sees CUDA; where
# hetpart is not importable it installs this checkout with `pip install --no-deps -e .`
# (torch, networkx, ortools, safetensors, rich must already be there, or be wheels in $WHEELS,
# installed with `pip install --no-index --find-links $WHEELS`).
#
# For each zoo model (gpt-small, llama, resnet, t5, unet):
#   1. hetpart profile --device cuda --device-type h200-141g (op times on this GPU);
#   2. partition onto 2 x h200-141g twice: roofline only, and with the profile;
#   3. load each plan's stages and time them back to back on the GPU, on one microbatch
#      (CUDA-synchronised, median of 50 after 10 warm-ups), against each plan's compute_us.
# Then benchmarks/activation_memory.py --device cuda: each zoo model's activation memory, predicted against
# autograd's saved tensors and torch.cuda.max_memory_allocated over a step.
# Prints markdown tables for docs/benchmarks.md; every file goes to OUT_DIR (default: a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d -t gpu-check-XXXX)}
mkdir -p "$OUT"
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" torch networkx ortools safetensors rich
fi
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check: torch sees no CUDA device")'
"$PY" -c 'import hetpart' 2>/dev/null || "$PY" -m pip install -q --no-deps -e .
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
uptime

cat > "$OUT/h200x2.toml" <<'EOF'
[[nodes]]
name = "g"
devices = ["h200-141g", "h200-141g"]
link = { bandwidth_GBps = 450, latency_us = 2 }
EOF

declare -A ARGS=(
  [gpt-small]="--batch-size 32 --seq-len 128"
  [llama]="--batch-size 32 --seq-len 128"
  [resnet]="--batch-size 64"
  [t5]="--batch-size 32 --seq-len 64"
  [unet]="--batch-size 32"
)
for m in gpt-small llama resnet t5 unet; do
  a=${ARGS[$m]}
  timeout 120 "$PY" -m hetpart profile "zoo:$m" $a --microbatches 4 --device cuda --device-type h200-141g \
    --repeats 20 --out "$OUT/$m.profile.json"
  for how in roofline profile; do
    extra=()
    [ "$how" = profile ] && extra=(--profile "$OUT/$m.profile.json")
    timeout 120 "$PY" -m hetpart partition "zoo:$m" $a --microbatches 4 --cluster "$OUT/h200x2.toml" \
      --out "$OUT/$m-$how" --no-pt2 --time-limit 10 --force "${extra[@]}" > "$OUT/$m-$how.log"
  done
done

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
from pathlib import Path

import torch

from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import load_manifest, load_stage

out = Path(sys.argv[1])
print("| model | plan | stage | predicted compute | measured on the GPU | measured / predicted |")
print("|---|---|---|---|---|---|")
for m in ("gpt-small", "llama", "resnet", "t5", "unet"):
    for how in ("roofline", "profile"):
        d = out / f"{m}-{how}"
        plan = json.loads((d / "plan.json").read_text())
        spec = ModelSpec.from_json(plan["model"])
        spec = ModelSpec(spec.model, spec.overrides, plan["microbatch_size"], spec.seq_len, spec.seed)
        _, inputs = load_model(spec)
        stages = [load_stage(d, e).to("cuda").eval() for e in load_manifest(d)["ranks"]]
        values = tuple(x.to("cuda") for x in inputs)
        with torch.no_grad():
            for k, stage in enumerate(stages):
                for _ in range(10):
                    stage(*values)
                times = []
                for _ in range(50):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    stage(*values)
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) * 1000)  # us
                measured = statistics.median(times)
                predicted = plan["stages"][k]["compute_us"]
                print(f"| {m} | {how} | {k} | {predicted:.1f} us | {measured:.1f} us | {measured / predicted:.2f} |",
                      flush=True)
                values = stage(*values)
                values = values if isinstance(values, tuple) else (values,)
EOF
# The cost model's activation memory against the GPU's own count (NOTE [memory the runtime adds]; "actmem").
timeout 300 "$PY" benchmarks/activation_memory.py --device cuda
uptime
