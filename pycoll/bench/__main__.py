"""python -m pycoll.bench"""

import sys

from . import main

sys.exit(main())
