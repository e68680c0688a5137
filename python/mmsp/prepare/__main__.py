"""`python -m mmsp.prepare ...`: see docs/prepare.md."""
import sys

from .cli import main

sys.exit(main())
