"""`python -m engine.sweep ...`: a sweep's runner (engine.sweep.runner's docstring)."""
import sys

from engine.sweep.runner import main

sys.exit(main())
