"""Fixtures for real servers live in tests/servers/; each module is a pytest plugin."""

pytest_plugins = [
]
