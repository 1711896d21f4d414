"""Benchmarks, one command per module: ``uv run python -m bench.NAME`` (docs/benchmarks.md)."""
