"""CLI sub-commands, one module per family; each exposes `register(app)`.

Command modules import torch (and anything slow) inside the command functions
only, so `infbench predict` starts without loading torch.
"""
