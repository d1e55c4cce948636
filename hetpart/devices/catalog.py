"""Device types with datasheet numbers. Sources: docs/devices.md.

Peak FLOP/s are dense (no sparsity) per dtype; a dtype a device has no units
for falls back to the rate it really runs at (for example bf16 on a V100 or a
T4 runs at its fp32 rate). Efficiencies and per-op overheads are the cost
model's assumptions, not datasheet numbers; `hetpart profile` (later) replaces
them with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

TFLOPS = 1e12
GB = 1e9  # datasheets quote decimal gigabytes
GiB = 1 << 30


@dataclass(frozen=True)
class DeviceType:
    name: str
    description: str
    peak_flops_per_s: dict[str, float]  # dtype ("fp32", "tf32", "fp16", "bf16", "fp8") -> FLOP/s
    mem_bw_bytes_per_s: float
    mem_bytes: int
    matmul_efficiency: float = 0.7  # share of peak a large matmul/conv reaches
    memory_efficiency: float = 0.8  # share of peak bandwidth a streaming op reaches
    overhead_ns: int = 4_000  # launch/dispatch cost paid by every op that runs a kernel

    def flops_per_s(self, dtype: str) -> float:
        """Peak rate for `dtype`, falling back to fp32 where the device has no faster units."""
        return self.peak_flops_per_s.get(dtype, self.peak_flops_per_s["fp32"])


CATALOG: dict[str, DeviceType] = {
    t.name: t
    for t in [
        DeviceType(
            "a100-80g",
            "NVIDIA A100 80GB SXM4",
            {"fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS, "fp16": 312 * TFLOPS, "bf16": 312 * TFLOPS},
            mem_bw_bytes_per_s=2039 * GB,
            mem_bytes=80 * GiB,
        ),
        DeviceType(
            "v100-32g",
            "NVIDIA V100 32GB SXM2",
            {"fp32": 15.7 * TFLOPS, "fp16": 125 * TFLOPS},
            mem_bw_bytes_per_s=900 * GB,
            mem_bytes=32 * GiB,
        ),
        DeviceType(
            "t4-16g",
            "NVIDIA T4 16GB (PCIe, 70 W)",
            {"fp32": 8.1 * TFLOPS, "fp16": 65 * TFLOPS},
            mem_bw_bytes_per_s=320 * GB,
            mem_bytes=16 * GiB,
        ),
        DeviceType(
            "cpu",
            "Server CPU socket (Xeon Platinum 8380: 40 cores, AVX-512, 8ch DDR4-3200)",
            {"fp32": 2.9 * TFLOPS},
            mem_bw_bytes_per_s=204.8 * GB,
            mem_bytes=256 * GiB,
            matmul_efficiency=0.5,
            memory_efficiency=0.6,
            overhead_ns=2_000,
        ),
    ]
}


def device_type(name: str) -> DeviceType:
    from hetpart.errors import HetpartError

    try:
        return CATALOG[name]
    except KeyError:
        raise HetpartError(
            f"unknown device type '{name}' (known: {', '.join(sorted(CATALOG))}); "
            "see `hetpart devices`"
        ) from None
