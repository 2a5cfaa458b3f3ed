"""Mutation testing of the core paths (scripts/mutate; CONTRIBUTING.md, "Mutation testing").

- :mod:`.sql`: the ledger's SQL mutants (its own operators: no Python mutation tester reads
  ``.sql`` files) and the equivalent ones;
- :mod:`.python`: mutmut's mutants of the Python, and the equivalent ones;
- :mod:`.plugin`: the runner, a pytest plugin that runs every mutant in one pytest process;
- ``python -m tests.mutation``: the command scripts/mutate calls.

A survivor is either a missing test or an equivalent mutant (the change alters no behaviour);
``EQUIVALENT`` and ``PY_EQUIVALENT`` say why for each of those, and the tables count them apart.
"""
