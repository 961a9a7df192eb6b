"""Shared by every test: the project root and a marker-based check for leftover job processes."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
