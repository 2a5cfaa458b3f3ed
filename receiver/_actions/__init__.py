"""The agent-action entry point: an action as the executor keys it (``action``: the tool, the
proposed action with its key and fingerprint, the call and the stored result), the executor
that claims it, runs the tool once and replays its stored result (``executor``), and its
metrics, keys per conversation turn included (``metrics``). Imports the shared layers, never
another entry point.
"""
