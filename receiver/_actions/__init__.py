"""The agent-action entry point: the executor (``executor``) that keys each proposed action
from a scope and a system-assigned id, claims it, runs the tool once and replays its stored
result; and its metrics, keys per conversation turn included (``metrics``). Imports the
shared layers, never another entry point.
"""
