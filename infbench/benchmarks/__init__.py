"""Benchmarks run by `make bench` and `make bench-gpu` (they print figures; no test asserts speed)."""
