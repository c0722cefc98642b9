"""The benchmark scripts (benchmarks/*.py) as modules, for the tests that check them on a CPU."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIRECTORY = os.path.join(ROOT, "benchmarks")


def path(name: str) -> str:
    return os.path.join(DIRECTORY, f"{name}.py")


def load(name: str, module_name: str | None = None):
    """benchmarks/<name>.py imported as a module (its own imports of scripts beside it found while it loads)."""
    sys.path.insert(0, DIRECTORY)
    try:
        spec = importlib.util.spec_from_file_location(module_name or name, path(name))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(DIRECTORY)
    return module
