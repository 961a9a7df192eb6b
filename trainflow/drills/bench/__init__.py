"""Benchmarks of trainflow's parts on this machine: `trainflow bench ...` prints measured figures."""
