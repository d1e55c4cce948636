"""`partition --tensor-parallel T` or `--tensor-parallel KEY=T,...`: parsed and checked before torch.

A KEY is a machine of the cluster or a device type (every machine's devices of that type); each
machine's devices of one type (a place, `TPSlot.place`) run at the degree given for it, 1 where none
is (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py). Torch-free, so a mistyped machine is
reported before torch is imported (NOTE [arguments before torch] in cli.py).

    >>> parse_tensor_parallel("2")
    (2, ())
    >>> parse_tensor_parallel("a=2, l4-24g=1")
    (2, (('a', 2), ('l4-24g', 1)))
"""

from __future__ import annotations

from collections.abc import Sequence

from hetpart.devices.cluster import Cluster, Machine
from hetpart.errors import HetpartError, did_you_mean

TP_DEGREES = (1, 2, 4, 8)


def parse_tensor_parallel(text: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """`--tensor-parallel`'s value: (the degree, ()) for one number; for KEY=T pairs, (their largest degree, the
    pairs). Only the syntax and the degrees are checked here; the keys against a cluster by `degree_of_place`."""
    text = text.strip()
    if "=" not in text:
        if not text.isdigit() or int(text) not in TP_DEGREES:
            raise HetpartError(f"--tensor-parallel {text}: expected one of {', '.join(map(str, TP_DEGREES))}, or "
                               "MACHINE=T,... (a machine or device type and its degree, e.g. a=2,b=1)")
        return int(text), ()
    pairs = []
    for part in text.split(","):
        key, _, value = (x.strip() for x in part.partition("="))
        if not key or not value.isdigit() or int(value) not in TP_DEGREES:
            raise HetpartError(f"--tensor-parallel {text}: {part.strip()!r} must be MACHINE=T or DEVICE_TYPE=T with T "
                               f"one of {', '.join(map(str, TP_DEGREES))}, e.g. --tensor-parallel a=2,b=1")
        if key in dict(pairs):
            raise HetpartError(f"--tensor-parallel {text}: {key!r} is given twice; give each machine one degree")
        pairs.append((key, int(value)))
    return max(t for _, t in pairs), tuple(pairs)


def degree_of_place(pairs: Sequence[tuple[str, int]], cluster: Cluster) -> dict[str, int]:
    """Each machine's devices of one type (`machine:type`) -> its degree: a machine's own entry, else its type's,
    else 1. Errors: a key that is neither a machine nor a device type of `cluster`, a degree that does not divide a
    place's device count, every place at one degree (that is `--tensor-parallel T`, or no TP)."""
    text = ",".join(f"{k}={t}" for k, t in pairs)
    machines = {m.name: m for m in cluster.machines}
    types = {d.type.name for d in cluster.devices}
    for key, _ in pairs:
        if key not in machines and key not in types:
            known = sorted(machines) + sorted(types)
            raise HetpartError(f"--tensor-parallel {text}: {key!r} is neither a machine nor a device type of cluster "
                               f"'{cluster.name}' (machines: {', '.join(sorted(machines))}; device types: "
                               f"{', '.join(sorted(types))}){did_you_mean(key, known)}")
    given = dict(pairs)
    out: dict[str, int] = {}
    for place, (m, ty, n) in places(cluster).items():
        t = given.get(m.name, given.get(ty, 1))
        if n % t:
            raise HetpartError(f"--tensor-parallel {text}: machine '{m.name}' has {n} {ty} device(s), which "
                               f"TP {t} does not divide: give it a degree that divides {n}")
        out[place] = t
    if len(set(out.values())) == 1:
        t = next(iter(out.values()))
        raise HetpartError(f"--tensor-parallel {text} puts every machine at TP {t}: "
                           + (f"pass --tensor-parallel {t}" if t > 1 else "leave --tensor-parallel out") + " instead")
    return out


def places(cluster: Cluster) -> dict[str, tuple[Machine, str, int]]:
    """Each place, a machine's devices of one type (`machine:type`, `TPSlot.place`) -> (the machine, the type, how
    many devices of it the machine has), in cluster order."""
    out: dict[str, tuple[Machine, str, int]] = {}
    for m in cluster.machines:
        for d in m.devices:
            place = f"{m.name}:{d.type.name}"
            out[place] = (m, d.type.name, out[place][2] + 1 if place in out else 1)
    return out


__all__ = ["TP_DEGREES", "degree_of_place", "parse_tensor_parallel", "places"]
