"""Runnable examples of the docs (each file says how to run it). A package, so that an installed
distribution shipping a top-level ``examples`` package (paddle-python-sdk does) cannot hide it."""
