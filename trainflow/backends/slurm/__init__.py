"""Slurm backend."""
