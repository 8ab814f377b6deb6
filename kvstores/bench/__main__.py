"""``python -m kvstores.bench``: the same as ``kvstores bench``."""

import sys

from kvstores.bench import main

sys.exit(main())
