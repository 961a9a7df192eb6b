"""Faults on purpose: chaos injection, drills, soaks, benchmarks and the servers they start."""
