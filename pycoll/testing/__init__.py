"""pycoll.testing: multi-rank tests from a plain ``pytest``.

Installed as a pytest plugin (entry point ``pycoll``), so a project that
installs pycoll has it. Mark a test ``@pytest.mark.mpi(ranks=4)`` and plain
``pytest`` runs it on 4 MPI ranks in a fresh job, with one outcome for all
ranks, every failing rank's traceback labelled, and a timeout that shows
every rank's stack. See :mod:`pycoll.testing.plugin` for the modes and the
README for a walk-through.
"""
