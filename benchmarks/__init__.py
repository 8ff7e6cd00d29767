"""Benchmarks: scripts that print numbers and write them to benchmarks/results/."""
