"""Shared fixtures for the p2psync test suite."""
