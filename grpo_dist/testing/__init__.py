"""Fault injection and test helpers that actors import (they pickle by reference); never imported by
production code."""


def imported(worker, names: tuple[str, ...]) -> list[str]:
    """Which of the top-level modules ``names`` this actor's process has imported."""
    import sys

    return [n for n in names if n in sys.modules]
