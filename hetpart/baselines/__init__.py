"""Baselines that need the FX graph: other tools' partitioners run on hetpart's annotated graph.

The torch-free baselines (`equal-layers`, `parameters`, `dp-topo-order`) are in
`hetpart/partitioner/baselines.py`; this package sits above `passes/` and `partitioner/`
and costs what other tools would plan in hetpart's model (`fx_partitioner.py`: torch.fx's
`accelerator_partitioner`).
"""
