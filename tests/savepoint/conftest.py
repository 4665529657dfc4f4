"""Fixtures of the savepoint tests; the helpers live in savepoint_helpers.py, a module with a
name of its own (two test folders' ``conftest`` modules would shadow each other on import)."""

from savepoint_helpers import store  # noqa: F401 - a fixture, found by pytest through this module
