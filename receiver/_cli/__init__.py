"""The ``receiver`` command: one module per command group. Imports anything; nothing
imports it.
"""

from .main import main

__all__ = ["main"]
