"""Predictions under load: a discrete-event run of the engine's own scheduler over steps
priced by the cost model (`engine_sim`, `step_cost`); no torch, deterministic for a seed.

It sits between the engine (whose `Scheduler`, `BlockManager` and `Sequence` it runs
unchanged) and `measure` (which draws the requests, calls it, and summarizes its records
with the same metrics code as a measured run: `measure/simulation.py`).
"""
