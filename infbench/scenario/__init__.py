"""The YAML scenario: one pydantic schema, parsed once into typed points (no torch)."""
