"""Measured costs: `hetpart profile` times a model's ops on this machine (NOTE [profile keys]).

`table.py` is the profile file and its keys (the op-cost pass reads it); `measure.py` the
measurement loop; `siblings.py` the processes that load the machine as the other ranks would;
`replay.py` the graph format those processes read. This file imports nothing, so that
`passes/op_cost.py` can import `table` without pulling in the measurement side.
"""
