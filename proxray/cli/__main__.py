"""``python -m proxray.cli …``: the ``proxray`` command."""
import sys

from proxray.cli import main

sys.exit(main())
