"""``python -m proxray``: the command line."""
import sys

from proxray.cli import main

sys.exit(main())
