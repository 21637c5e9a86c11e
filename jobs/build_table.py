"""Ray job entry point of the evaluation job (thin: everything lives in proxray.evaljob).

    ray job submit --working-dir . -- python jobs/build_table.py --config jobs/configs/paper_pool.yaml
"""
import sys

from proxray.evaljob import main

if __name__ == "__main__":
    sys.exit(main())
