"""The analytic roofline model (pure Python, never imports torch).

`costs` turns a model config and one step's batch composition into per-operator
FLOPs and bytes; `analysis` turns those into stage times, throughput, memory and
the largest batch that fits.  The measured half of infbench calls the same
`step_costs` for every real engine step, so predicted and measured points agree
on what an operator is.
"""
