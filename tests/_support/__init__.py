"""Helpers shared by test modules (on the test path through ``pythonpath`` in pyproject)."""
