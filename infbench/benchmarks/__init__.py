"""Benchmarks run by `make bench` and `make bench-gpu`.

They print figures; no test asserts a speed.
"""
