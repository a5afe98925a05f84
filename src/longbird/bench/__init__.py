"""Benchmark helpers: peak-memory sampling and timing shared by `longbird bench` and benchmarks/."""
