"""The drift scenario in one command (same as `proxray demo drift`); last line: JSON before/after."""
import os
import sys

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from proxray.demos.drift import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
