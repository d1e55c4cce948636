"""Device types (datasheet numbers) and cluster specs (machines, devices, links)."""

from hetpart.devices.catalog import CATALOG, DeviceType, device_type
from hetpart.devices.cluster import PRESETS, Cluster, ClusterDevice, LinkSpec, Machine, load_cluster, parse_cluster

__all__ = [
    "CATALOG", "PRESETS", "Cluster", "ClusterDevice", "DeviceType", "LinkSpec", "Machine",
    "device_type", "load_cluster", "parse_cluster",
]
