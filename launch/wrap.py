"""What the MPI launcher runs on each rank, by path: the rank wrapper.

    python -S .../pycoll/launch/wrap.py <target argv...>

The wrapper itself is rank.py, imported from here (this file's folder is
first on sys.path) rather than run by path: a script run by path is compiled
from its source at every start, where an imported module's compiled form,
written when pycoll was installed, is used (1.5 ms of each rank's start).
"""

import sys

import rank

rank.wire.exit_now(rank.main(sys.argv[1:]))
