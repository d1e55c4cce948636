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
MiB = 1 << 20


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


# NOTE [capacity CUDA reports]
# A device's memory is what `torch.cuda.get_device_properties(i).total_memory` (CUDA's totalGlobalMem) reports on
# it, in MiB, not the datasheet's "80GB" read as GiB: the driver keeps part of the board (ECC, its own reservations)
# and the planner fills devices to the byte, so a datasheet capacity plans stages that cannot be allocated (a T4's
# "16GB" is 14.6 GiB to CUDA, 9% less; an L4's "24GB" 22.0 GiB). The smallest total public outputs show is taken
# (docs/devices.md cites each). What the CUDA context, NCCL and the allocator take out of it is not counted here:
# `partition --memory-reserve` (NOTE [memory reserve]) and the plan table's note (NOTE [memory the runtime adds]).
def _gpu(name: str, description: str, peaks_tflops: dict[str, float], bw_GBps: float, mem_MiB: float,
         **assumptions: float) -> DeviceType:
    return DeviceType(name, description, {k: v * TFLOPS for k, v in peaks_tflops.items()},
                      mem_bw_bytes_per_s=bw_GBps * GB, mem_bytes=int(mem_MiB * MiB), **assumptions)


# Dense datasheet peaks (TFLOP/s), bandwidth (GB/s), capacity (MiB, NOTE [capacity CUDA reports]); docs/devices.md
# cites each.
CATALOG: dict[str, DeviceType] = {
    t.name: t
    for t in [
        _gpu("a100-40g", "NVIDIA A100 40GB SXM4", {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312}, 1555, 40536),
        _gpu("a100-80g", "NVIDIA A100 80GB SXM4", {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312}, 2039, 81050),
        _gpu("h100-80g", "NVIDIA H100 80GB SXM5",
             {"fp32": 67, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 3350, 81082),
        _gpu("h200-141g", "NVIDIA H200 141GB SXM",
             {"fp32": 67, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}, 4800, 143156),
        _gpu("v100-16g", "NVIDIA V100 16GB SXM2", {"fp32": 15.7, "fp16": 125}, 900, 16130),
        _gpu("v100-32g", "NVIDIA V100 32GB SXM2", {"fp32": 15.7, "fp16": 125}, 900, 32510),
        _gpu("t4-16g", "NVIDIA T4 16GB (PCIe, 70 W)", {"fp32": 8.1, "fp16": 65}, 320, 14930),
        _gpu("l4-24g", "NVIDIA L4 24GB (PCIe, 72 W)",
             {"fp32": 30.3, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5}, 300, 22574),
        _gpu("a10g-24g", "NVIDIA A10G 24GB (AWS G5)", {"fp32": 31.2, "tf32": 62.5, "fp16": 125, "bf16": 125}, 600, 22587),
        _gpu("rtx4090-24g", "NVIDIA GeForce RTX 4090 24GB",
             {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}, 1008, 24563),
        _gpu("mi250x", "AMD Instinct MI250X (both GCDs)", {"fp32": 95.7, "fp16": 383, "bf16": 383}, 3277, 2 * 65520),
        _gpu("mi300x", "AMD Instinct MI300X",
             {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9}, 5300, 196592),
        _gpu("cpu", "Server CPU socket (Xeon Platinum 8380: 40 cores, AVX-512, 8ch DDR4-3200)",
             {"fp32": 2.9}, 204.8, 256 * 1024, matmul_efficiency=0.5, memory_efficiency=0.6, overhead_ns=2_000),
    ]
}


def device_type(name: str) -> DeviceType:
    from hetpart.errors import HetpartError, did_you_mean

    try:
        return CATALOG[name]
    except KeyError:
        raise HetpartError(
            f"unknown device type '{name}' (known: {', '.join(sorted(CATALOG))}){did_you_mean(name, CATALOG)}; "
            "see `hetpart devices`"
        ) from None


def catalog_markdown() -> str:
    """The catalog as the README's list, between its `device types` markers (tests/export/test_cluster_files.py
    keeps them equal; regenerate with `python -c "from hetpart.devices.catalog import catalog_markdown as c; print(c())"`)."""
    lines = []
    for t in CATALOG.values():
        half = max(t.flops_per_s("fp16"), t.flops_per_s("bf16"))
        lines.append(f"- `{t.name}`: {t.description}; {f'{t.mem_bytes / GiB:.2f}'.rstrip('0').rstrip('.')} GiB, {t.flops_per_s('fp32') / TFLOPS:g} "
                     f"TFLOP/s fp32, {half / TFLOPS:g} fp16/bf16, {t.mem_bw_bytes_per_s / GB:g} GB/s")
    return "\n".join(lines)
