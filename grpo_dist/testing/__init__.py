"""Fault injection and test helpers that actors import (they pickle by reference); never imported by
production code."""
