"""Checkpoints: manifests, storage tiers, save/restore with DCP, and the catalog of commits."""
