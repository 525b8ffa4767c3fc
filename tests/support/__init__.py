"""Plain helpers shared by every test directory (no fixtures: those live in conftest.py files)."""
