"""``python -m pathways_kernel.server`` is ``pathways-local``."""

import sys

from pathways_kernel.server.cli import main

sys.exit(main())
