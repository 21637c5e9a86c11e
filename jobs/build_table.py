"""Ray job entry point of the evaluation job: ``proxray build-table`` (everything lives in proxray.evaljob).

    ray job submit --working-dir . -- python jobs/build_table.py --config jobs/configs/paper_pool.yaml
"""
import sys

from proxray.cli import main

if __name__ == "__main__":
    sys.exit(main(["build-table", *sys.argv[1:]]))
