"""What the monitor shows: its status (``proxray monitor status``) and the same as Prometheus text
(``proxray monitor metrics``; the Grafana dashboard reads it)."""
from __future__ import annotations

import numpy as np


def status_of(m) -> dict:
    """A ``DriftMonitor``'s status, read under its lock by the caller."""
    book, ev, recent = m.book, m.evaluations, list(m.book.window)
    return {
        "name": m.config.name, "reported": book.stats["reported"], "drifted": book.stats["drifted"],
        "outlier_rate": float(np.mean([r["drifted"] for r in recent])) if recent else 0.0,
        "outlier_threshold": m.detector.threshold, "overlap_threshold": m.overlap.threshold,
        "overlap": m.overlap.by_kind(), "groups": m.overlap.by_group(),
        "drift_queue": len(book.drift_queue), "shadow_queue": len(book.shadow_queue),
        "shadow_labelled": len(m.overlap.observed), "dropped_full": book.stats["dropped_full"],
        "repeats": book.stats["repeats"], "spent_usd": round(ev.spent, 8), "budget_usd": m.config.cost_budget,
        "est_cost_per_query": ev.est_cost, "blocked": m.blocked,
        "evaluations": len([e for e in ev.items if e["kind"] == "drift"]),
        "jobs": [{k: e.get(k) for k in ("id", "job", "kind", "n", "status", "charged", "error")} for e in ev.items[-8:]],
        "router_version": m.publisher.version, "router_path": m.publisher.path, "served_version": m.publisher.served,
        "models": m.publisher.models, "judge": m.config.job.grader.model,
        "feedback": m.feedback_book.status(), "scheduler": m.scheduler.alive, "events": book.events[-10:],
        "gate": {"enabled": m.config.gate.enabled, **m.candidates.status()}, "label_sources": m.sources.status(),
        "jobs_api": jobs_api(m.evaluations.runner)}


def jobs_api(runner) -> str | None:
    """Where the monitor submits its evaluations (the Jobs API's URL, or inline), for operators."""
    try:
        return runner.where()
    except Exception:  # noqa: BLE001 - a runner without an address, or the GCS not reachable: not shown
        return None


def prometheus_text(s: dict) -> str:
    """Prometheus exposition lines from ``DriftMonitor.status()``."""
    lines = [f"proxray_monitor_reported_total {s['reported']}", f"proxray_monitor_drifted_total {s['drifted']}",
             f"proxray_monitor_outlier_rate {s['outlier_rate']}", f"proxray_monitor_drift_queue {s['drift_queue']}",
             f"proxray_monitor_shadow_labelled {s['shadow_labelled']}",
             f"proxray_monitor_evaluations_total {s['evaluations']}", f"proxray_monitor_spent_usd {s['spent_usd']}",
             f"proxray_monitor_router_version {s['router_version']}",
             f"proxray_monitor_served_version {s['served_version']}",
             f"proxray_monitor_topz_overlap_threshold {s['overlap_threshold']}"]
    fb = s["feedback"]
    lines += [f"proxray_monitor_feedback_received_total {fb['received']}",
              f"proxray_monitor_feedback_absorbed_total {fb['absorbed'] + fb['merged']}",
              f"proxray_monitor_feedback_pending {fb['pending']}"]
    gate = s.get("gate") or {}
    cand = gate.get("candidate")
    lines.append(f"proxray_monitor_candidate_version {cand['version'] if cand else -1}")
    for decision, n in (gate.get("decisions") or {}).items():
        lines.append(f'proxray_monitor_gate_decisions_total{{decision="{decision}"}} {n}')
    last = gate.get("last_decision")
    if last:
        lines.append(f'proxray_monitor_gate_last_decision{{version="{last["version"]}",decision="{last["decision"]}"}} 1')
    for source, t in (s.get("label_sources") or {}).items():
        name = source.replace("\\", "").replace('"', "")
        if t["agreement"] is not None:
            lines.append(f'proxray_monitor_label_source_agreement{{source="{name}"}} {t["agreement"]}')
        lines.append(f'proxray_monitor_label_source_checked{{source="{name}"}} {t["checked"]}')
        lines.append(f'proxray_monitor_label_source_set_aside{{source="{name}"}} {int(t["set_aside"])}')
    for kind, o in s["overlap"].items():
        if o["j"] is not None:
            lines.append(f'proxray_monitor_topz_overlap{{traffic="{kind}"}} {o["j"]}')
    for g, o in s["groups"].items():
        lines.append(f'proxray_monitor_group_topz_overlap{{group="{g}"}} {o["j"]}')
    return "\n".join(lines) + "\n"


class GateGauges:
    """The versions and gate of ``status_of`` as ``ray.util.metrics`` series (the monitor application's replica sets
    them on every health check): gauges, and the gate's decisions a counter, as the monitor's own text has them (it
    counts on by the decisions the status shows since the last check; a monitor that started again and shows fewer
    counts on from there)."""

    def __init__(self):
        from proxray.common.metric_defs import metric

        self.served = metric("proxray_monitor_served_version")
        self.candidate = metric("proxray_monitor_candidate_version")
        self.decisions = metric("proxray_monitor_gate_decisions")
        self.last = metric("proxray_monitor_gate_last_decision")
        self.agreement = metric("proxray_monitor_label_source_agreement")
        self.set_aside = metric("proxray_monitor_label_source_set_aside")
        self._last = None
        self._decided: dict[str, int] = {}

    def set(self, s: dict) -> None:
        gate = s.get("gate") or {}
        self.served.set(s["served_version"])
        self.candidate.set((gate.get("candidate") or {}).get("version", -1))
        for decision, n in (gate.get("decisions") or {}).items():
            if n > self._decided.get(decision, 0):
                self.decisions.inc(n - self._decided.get(decision, 0), {"decision": decision})
            self._decided[decision] = n
        last = gate.get("last_decision")
        if last:
            tags = {"version": str(last["version"]), "decision": last["decision"], "why": str(last["why"])[:160]}
            if self._last and self._last != tags:
                self.last.set(0, self._last)
            self.last.set(1, tags)
            self._last = tags
        for source, t in (s.get("label_sources") or {}).items():
            if t["agreement"] is not None:
                self.agreement.set(t["agreement"], {"source": source})
            self.set_aside.set(int(t["set_aside"]), {"source": source})
