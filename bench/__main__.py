"""``python -m bench [--only AREA]`` (``make bench``, ``make bench ONLY=<area>``)."""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Measure what production runs: no DEBUG query log (an explicit DEBUG=1 still wins).
os.environ.setdefault("DEBUG", "0")

# Imported after the environment is set, so settings read it.
from bench.harness import main

sys.exit(main())
