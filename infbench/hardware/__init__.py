"""The hardware table, calibrated profiles and their checks (no torch)."""
