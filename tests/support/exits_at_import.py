"""A module that calls ``sys.exit()`` when imported: a process-ending exit, not an import
failure, so it must reach the process."""

import sys

sys.exit(3)
