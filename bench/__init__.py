"""Benchmarks (not tests: nothing here is collected by pytest). See docs/benchmarks.md."""
