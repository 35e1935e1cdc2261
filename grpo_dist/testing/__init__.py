"""Fault injection and test helpers that actors import; never imported by production code."""
