"""Reproducibility: the environment fingerprint, the machine's topology, and reruns of earlier runs."""
