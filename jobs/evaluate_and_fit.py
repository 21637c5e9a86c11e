"""Ray job entry point that evaluates the pool and then fits the router on the table it wrote — the evaluation job
and the fit (``proxray.routing.fitting.fit_and_save``, what `proxray fit --router km` runs) in one job, for a cluster that runs one job and leaves (KubeRay's RayJob,
deploy/kuberay/rayjob.yaml). The router's location is checked writable before the evaluation starts.

    python jobs/evaluate_and_fit.py --config CONFIG --out TABLES --router-out ROUTER [build-table options]
"""
import sys

from proxray.cli import main


def split(argv: list) -> tuple:
    """(build-table's arguments, the router's location, the table the evaluation writes)."""
    from proxray.common.storage import join

    if "--router-out" not in argv or argv.index("--router-out") + 1 >= len(argv):
        raise SystemExit("evaluate_and_fit.py: --router-out ROUTER is required (where the fitted router goes)")
    if "--out" not in argv or argv.index("--out") + 1 >= len(argv):
        raise SystemExit("evaluate_and_fit.py: --out TABLES is required (where the evaluation writes its table)")
    i = argv.index("--router-out")
    rest = argv[:i] + argv[i + 2:]
    return rest, argv[i + 1], join(rest[rest.index("--out") + 1], "routing_table.parquet")


if __name__ == "__main__":
    build, router, table = split(sys.argv[1:])
    from proxray.common.storage import check_location

    check_location(router, "--router-out", write=True)
    code = main(["build-table", *build])
    if code:
        sys.exit(code)
    from proxray.routing.fitting import FitSettings, fit_and_save

    fitted = fit_and_save(table, router, FitSettings(router="km"))
    print(f"fitted {fitted!r} on {table} -> {router}")
