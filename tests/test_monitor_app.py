"""The drift monitor as a Serve application (how the RayService runs it): deployed from a monitor config, it starts
the monitor actor; when the actor is gone for good, the replica's health check starts it again, and it answers with
its checkpointed state. A bad config fails at build time, naming the field."""
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from journey import until  # noqa: E402

pytestmark = pytest.mark.slow


def test_the_monitor_application_keeps_the_monitor_running(tmp_path, fresh_ray):
    import ray
    from ray import serve

    from proxray.cli import main
    from proxray.monitor import get_monitor, stop_monitor
    from proxray.monitor.app import build_app

    cfg = yaml.safe_load(open("monitor_configs/cpu_demo.yaml"))
    models = ",".join(m["id"] for m in cfg["job"]["models"])
    assert main(["fit", "--router", "knn", "--k", "50", "--models", models, "--out", str(tmp_path / "router")]) == 0
    cfg.update(router=str(tmp_path / "router"), state_dir=str(tmp_path / "monitor"), submit="inline")
    (tmp_path / "monitor.yaml").write_text(yaml.safe_dump(cfg))

    with pytest.raises(ValueError, match="health_check_period_s"):
        build_app({"config": str(tmp_path / "monitor.yaml"), "health_check_period_s": 0})
    bad = {**cfg, "z": 0}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"z: Input should be greater than or equal to 1"):
        build_app({"config": str(tmp_path / "bad.yaml")})

    try:
        serve.run(build_app({"config": str(tmp_path / "monitor.yaml"), "health_check_period_s": 1}),
                  name="proxray-monitor", route_prefix=None)

        def answers():
            monitor = get_monitor()  # None until it runs
            try:
                return monitor and ray.get(monitor.status.remote(), timeout=5)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                return None

        first = until("the monitor, started by the application", answers, 180, every_s=0.5)
        assert first["name"] == "proxray-monitor" and first["router_version"] == 0
        # its versions and gate reach Ray's Prometheus endpoint, as the Grafana dashboard charts them
        import httpx

        from conftest import ROOT

        dash = json.loads((ROOT / "dashboards" / "proxray_grafana.json").read_text())
        charted = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"ray_proxray_monitor_\w+",
                                                                                       t["expr"])}
        port = ray.nodes()[0]["MetricsExportPort"]
        want = {"ray_proxray_monitor_served_version", "ray_proxray_monitor_candidate_version"}
        assert want | {"ray_proxray_monitor_gate_decisions_total"} < charted  # the rest once there is a decision

        def exported():
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            return all(w in text for w in want) and text

        text = until("the monitor's gauges on Ray's metrics endpoint", exported, 120, every_s=0.5)
        assert 'ray_proxray_monitor_candidate_version{' in text and "ray_proxray_monitor_served_version{" in text
        ray.get(get_monitor().report.remote("What is 2+2?", [0.0] * 384, 0.0))
        old = get_monitor()
        ray.get(old.stop.remote())  # its checkpoint, then gone for good (as `proxray monitor stop` leaves it)
        ray.kill(old, no_restart=True)
        again = until("the monitor, started again", answers, 180, every_s=0.5)
        assert again["reported"] == 1  # the new actor restored the state the old one checkpointed
        keeper = serve.get_deployment_handle("MonitorKeeper", app_name="proxray-monitor")
        assert keeper.starts.remote().result(timeout_s=30) == 2
    finally:
        serve.shutdown()
        stop_monitor()
