"""Configuration, the hardware table, the scenario schema, errors, and the small device,
metric-name and checkpoint-config helpers everything else builds on (no torch)."""
