"""Result files: load/validate/write, run directories, report tables and the compare/gate
logic (no torch)."""
