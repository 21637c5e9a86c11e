"""Progress lines for long-running commands, on stderr so stdout stays the result."""
import sys
import time


def log(msg: str, who: str = "proxray") -> None:
    print(f"[{who} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
