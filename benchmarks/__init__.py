"""Benchmarks: each writes its figures to benchmarks/results/."""
