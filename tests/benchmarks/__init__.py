"""Tests of the benchmark suites and tools (``benchmarks``)."""
