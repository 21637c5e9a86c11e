"""End-to-end drift scenario on CPU, through the production path: ``proxray demo drift`` (or
``python bench/drift_demo.py``).

1. Fit a kNN router on the synthetic table *without* task T (default gsm8k, whose best models differ
   most from the other tasks') and serve it (Ray Serve, simulated pool) with ``monitor:`` naming a
   monitor that does not exist yet (serving does not need it).
2. Start the monitor as an operator does: ``proxray monitor start --config monitor.yaml`` (a subprocess,
   against this cluster). From then on nothing here calls the monitor's decision methods: it runs by
   itself (its scheduler), labels with a judge model of the pool, submits evaluation jobs through the
   Ray Jobs API, absorbs them, and the router replicas switch.
3. Send inlier traffic, then T's queries, to the endpoint on 127.0.0.1 (the openai client). Wait, by
   reading ``status`` only, until a re-evaluation has been absorbed. Optionally (``kill_mid_evaluation``)
   kill the monitor actor while its first evaluation job runs: Ray restarts it, it restores its
   checkpoint and the job is not submitted twice.
4. Measure routing on T's held-out queries (never sent) with the first and the final router, and the
   shadow J_z of each kind of traffic.

Every version the monitor grows passes its gate before it serves (held-out scores against the served version, the
label sources' spot checks, a shadow window on the traffic that goes on); the result shows the gate's figures.

With ``--labels feedback`` the judge labels no drifted query (no drift evaluation): the users who sent T's queries
score each answer through ``POST /v1/feedback`` (their score is the answer's correctness in the table), with the λ
each of them routes with (a spread of cost preferences, so that several models answer). The monitor adds the scored
queries in batches of ``min_batch``, once the judge agreed with a sample of each (a small spot-check evaluation), and
the router grows from the users' scores, round after round: each round is routed by the router the previous rounds
grew. ``--poison inverted-feedback`` inverts every score (1 − s); ``--poison random-judge`` makes the judge grade at
random: in both the served version stays the first, and the result says why.

The last line printed is one JSON object: {"task", "before", "after", "evaluations", "judge",
"overlap_inlier", "overlap_new_task", "driver", ...} (AUC % on T).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from proxray.common.logs import log as _log
from proxray.pool.simulated import MODELS

# Qwen2-1.5B is poor at most tasks and good at gsm8k; Llama-3.2-1B is the cheapest and poor at gsm8k. The new
# task wants models the training tasks do not: its top-3 shares 0.23 with theirs (Jaccard, averaged over the
# training tasks), which share ~0.9 among themselves.
POOL = ["meta-llama/Llama-3.2-1B-Instruct", "Qwen/Qwen2-1.5B-Instruct", "microsoft/Phi-3-small-8k-instruct",
        "deepseek-ai/deepseek-math-7b-instruct", "mistralai/Mixtral-8x7B-Instruct-v0.1", "meta-llama/Llama-3.3-70B-Instruct"]
PRICES = {m: v for m, v in MODELS.items()}
JUDGE = "meta-llama/Llama-3.3-70B-Instruct"


def log(msg):
    _log(msg, "drift-demo")


def auc_on(router, X, acc, cost):
    from proxray.experiments.metrics import routing_score

    a, c = router.estimate(X)
    return routing_score(a, c, acc, cost)


def job_template(pool=POOL, judge=JUDGE, table=None, judge_error=None) -> dict:
    """The evaluation job the monitor submits: the simulated pool (answering ``table``'s prompts as it records), a
    judge of the pool grading (``judge_error``: the share of its verdicts flipped; 0.5 grades at random)."""
    def kwargs(m):
        kw = {"table": str(table)} if table else {}
        return {**kw, "judge_error": judge_error} if judge_error is not None and m == judge else kw

    return {"sampling": {"max_tokens": 64},
            "models": [{"id": m, "engine": "sim", "price": {"input_per_mtok": PRICES[m][1], "output_per_mtok": PRICES[m][2]},
                        "num_cpus": 0.25, "batch_size": 16, "engine_kwargs": kwargs(m)} for m in pool],
            "grader": {"model": judge}}


def monitor_config(state: Path, name: str, min_batch: int, judge_error=None, **overrides) -> dict:
    """The demo's monitor: its pool answers the synthetic table's prompts as the table records; a short shadow window."""
    return {"name": name, "router": str(state / "router_v0"), "table": str(state / "train_table.parquet"),
            "state_dir": str(state / "monitor"), "job": job_template(table=state / "full_table.parquet",
                                                                     judge_error=judge_error),
            "z": 3, "window": 300, "n_groups": 4, "min_batch": min_batch, "shadow_rate": 0.5, "shadow_batch": 30,
            "shadow_max_wait_s": 3.0, "min_group": 8, "max_evals_per_hour": 6, "cost_budget": 1.0, "tick_s": 1.0,
            "gate": {"window_requests": 10, "window_s": 5.0}, **overrides}


def _drift_jobs(jobs_address: str, prefix: str) -> list:
    from ray.job_submission import JobSubmissionClient

    return sorted(j.submission_id for j in JobSubmissionClient(jobs_address).list_jobs()
                  if (j.submission_id or "").startswith(prefix))


POISONS = ("inverted-feedback", "random-judge")


def run(task="gsm8k", n_per_task=60, min_batch=20, n_inliers=40, state_dir=None, timeout_s=300,
        kill_mid_evaluation=False, name="proxray-monitor", labels="judge", poison=None, port=None):
    import openai
    import ray
    from ray import serve

    from proxray.embeddings.encoder import SentenceEncoder
    from proxray.monitor import get_monitor
    from proxray.pool.simulated import make_table
    from proxray.routing.knn import KNNRouter
    from proxray.routing.registry import load_router
    from proxray.serve.app import build_app
    from proxray.serve.front import free_port, front_env

    state = Path(state_dir or tempfile.mkdtemp(prefix="proxray-drift-"))
    state.mkdir(parents=True, exist_ok=True)
    if poison not in (None, *POISONS):
        raise ValueError(f"poison={poison!r}: allowed values are {', '.join(POISONS)}")
    full = make_table(n_per_task)
    full.write(state / "full_table.parquet")  # the simulated models answer its prompts as it records
    enc = SentenceEncoder(progress=False)
    X = enc.encode(full.prompts)
    acc, cost = full.matrices(models=POOL)
    is_t = full.tasks == task
    rng = np.random.default_rng(0)
    t_idx = rng.permutation(np.flatnonzero(is_t))
    t_live, t_test = t_idx[: len(t_idx) // 2], t_idx[len(t_idx) // 2:]
    train = np.flatnonzero(~is_t)
    train_table = full.subset([full.query_ids[i] for i in train])
    train_table.write(state / "train_table.parquet")
    Xtr = enc.encode(train_table.prompts)  # the router in the table's own order (what the monitor assumes)
    a_tr, c_tr = train_table.matrices(models=POOL)
    router0 = KNNRouter(k=50, temperature=20.0).fit(Xtr, a_tr, c_tr, models=POOL, encoder_id=enc.id)
    router0.save(state / "router_v0")
    before = auc_on(router0, X[t_test], acc[t_test], cost[t_test])
    log(f"router v0 fitted without {task}: AUC on held-out {task} queries = {before:.2f}%")

    os.environ.update(front_env(local=True))  # the serving front proxray's clusters run (proxray.serve.front)
    # a Ray of its own ("local"), even where `ray start` left another on this machine, in a temp folder of its own
    # that names its address: the Jobs API starts each evaluation's driver on the cluster "auto" finds from there (Ray's
    # shared folder names the last `ray start`'s cluster, and without it Ray picks any cluster running here)
    temp = tempfile.mkdtemp(prefix="proxray-", dir=os.environ.get("RAY_TMPDIR") or "/tmp")  # short: Unix socket paths
    ctx = ray.init(address="local", include_dashboard=True, log_to_driver=False,
                   num_cpus=max(4, os.cpu_count() or 1), _temp_dir=temp)
    from ray._private.utils import write_ray_address

    write_ray_address(ctx.address_info["gcs_address"], temp)
    try:
        jobs_address = f"http://{ctx.dashboard_url}"  # the Ray Jobs API is served by the dashboard
        port = port or free_port()  # after Ray's own processes took theirs
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        auto = {"min_replicas": 1, "max_replicas": 1}
        serve.run(build_app({"router": str(state / "router_v0"), "monitor": name, "reload_every_s": 1.0,
                             "models": [{"id": m, "engine": "sim", "autoscaling": auto,
                                         "engine_kwargs": {"table": str(state / "full_table.parquet")}} for m in POOL]}),
                  name="proxray", route_prefix="/")
        log(f"serving on http://127.0.0.1:{port}/v1 (model 'proxray')")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
        # the app names a monitor that does not exist yet: serving does not need it
        early = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "What is 2 + 2?"}])
        cfg_path = state / "monitor.yaml"
        import yaml

        by_feedback = labels == "feedback"  # users' scores label; the judge only spot-checks them (no drift evaluation)
        overrides = ({"max_evals_per_hour": 0, "shadow_rate": 0.0, "feedback_batch": min_batch, "feedback_max_wait_s": 3.0}
                     if by_feedback else {"shadow_rate": 0.0} if poison else {})  # J_z is not what a poisoned run shows
        judge_error = 0.5 if poison == "random-judge" else None
        cfg_path.write_text(yaml.safe_dump(monitor_config(state, name, min_batch, judge_error, **overrides)))
        # the operator's command, against this cluster
        started = subprocess.run([sys.executable, "-m", "proxray.cli", "monitor", "start", "--config", str(cfg_path),
                                  "--address", ctx.address_info["gcs_address"]], capture_output=True, text=True, timeout=600)
        if started.returncode != 0:
            raise RuntimeError(f"proxray monitor start failed:\n{started.stdout}\n{started.stderr}")
        monitor = get_monitor(name)
        inliers = [full.prompts[i] for i in rng.choice(train, n_inliers, replace=False)]
        live = [full.prompts[i] for i in t_live]

        def send(prompts):
            for p in prompts:
                client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": p}])

        def status():
            return ray.get(monitor.status.remote(), timeout=60)

        log(f"sending {len(inliers)} inlier queries, then {len(live)} {task} queries")
        send(inliers)
        for _ in range(60):  # reports are fire-and-forget: wait until the monitor has them all
            st = status()
            if st["reported"] >= len(inliers):
                break
            time.sleep(0.5)
        inlier_flags = st["drifted"]
        t_sent = time.time()
        scored = feedback_rounds(client, port, [int(i) for i in t_live], full, acc, cost, min_batch, status, timeout_s,
                                 inverted=poison == "inverted-feedback", probes=inliers) if by_feedback else send(live)
        deadline = t_sent + timeout_s
        killed, killed_at = False, None
        final = None
        st = {}
        while time.time() < deadline:
            try:
                st = status()
            except Exception as e:  # noqa: BLE001 - restarting after the kill
                log(f"monitor not answering yet ({type(e).__name__})")
                time.sleep(1)
                continue
            running = [j for j in st["jobs"] if j["kind"] == "drift" and j["status"] == "RUNNING"]
            if kill_mid_evaluation and not killed and running:
                log(f"killing the monitor actor while {running[0]['id']} runs")
                ray.kill(monitor, no_restart=False)  # Ray restarts it (max_restarts=-1)
                killed, killed_at = True, time.time()
                time.sleep(1)
                continue
            if sum(st["gate"]["decisions"].values()) and _settled(st):  # the gate decided and nothing more is under way
                final = st["router_path"] if st["served_version"] else None
                log(f"gate: {st['gate']['last_decision']['decision']} version {st['gate']['last_decision']['version']}: "
                    f"{st['gate']['last_decision']['why']}")
                break
            log(f"monitor: {st['drifted']} drifted of {st['reported']}, queue {st['drift_queue']}, "
                f"shadow {st['shadow_labelled']}, jobs {[(j['kind'], j['status']) for j in st['jobs']]}, "
                f"candidate {(st['gate']['candidate'] or {}).get('version')}")
            send(inliers[:2])  # traffic goes on: a candidate's shadow window routes it beside the served router
            time.sleep(1)
        absorbed_s = time.time() - t_sent
        served = None
        for _ in range(30):  # the served router switches without a restart
            served = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": live[0]}])
            if not final or served.model_extra["proxray"]["router_path"] == final:
                break  # (nothing new served: the one request shows what serves)
            time.sleep(1)
        # shadow J_z of each kind of traffic: let the shadow queue drain (a few more seconds) first
        for _ in range(90):
            st = status()
            if st["shadow_queue"] == 0 and not any(j["kind"] == "shadow" and j["status"] in ("SUBMITTING", "RUNNING")
                                                   for j in st["jobs"]):
                break
            time.sleep(1)
        cli_status = subprocess.run([sys.executable, "-m", "proxray.cli", "monitor", "status", "--name", name,
                                     "--address", ctx.address_info["gcs_address"]], capture_output=True, text=True, timeout=120)
        st = json.loads(cli_status.stdout)  # the operator's view
        over_in = ray.get(monitor.overlap_of.remote(inliers))
        over_new = ray.get(monitor.overlap_of.remote(live))
        drift_jobs = _drift_jobs(jobs_address, f"{name}-drift-")
        after = auc_on(load_router(final), X[t_test], acc[t_test], cost[t_test]) if final else before
        first = next((e for e in st["events"] if e["event"] == "first_drift"), None)
        result = {"task": task, "before": round(before, 2), "after": round(after, 2), "evaluations": st["evaluations"],
                  "drifted": st["drifted"], "reported": st["reported"], "outlier_threshold": round(st["outlier_threshold"], 4),
                  "inliers_flagged": inlier_flags, "new_task_sent": len(live),
                  "detected_after_new_task_queries": (first["reported"] - len(inliers)) if first else None,
                  "absorbed_after_s": round(absorbed_s, 1) if final else None,
                  "served_router_switched": bool(final and served.model_extra["proxray"]["router_path"] == final),
                  "judge": st["judge"], "overlap_threshold": round(st["overlap_threshold"], 4),
                  "overlap_inlier": over_in["j"], "overlap_inlier_n": over_in["n"],
                  "overlap_new_task": over_new["j"], "overlap_new_task_n": over_new["n"],
                  "spent_usd": st["spent_usd"], "drift_jobs": drift_jobs, "killed_mid_evaluation": killed,
                  "served_before_monitor": bool(early.choices[0].message.content), "driver": "monitor",
                  "labels": labels, "feedback_scored": scored or 0, "feedback": st["feedback"], "poison": poison,
                  "served_version": st["served_version"], "gate": st["gate"], "label_sources": st["label_sources"],
                  "versions": timeline(ray.get(monitor.versions.remote(), timeout=60), t_sent, load_router,
                                       X[t_test], acc[t_test], cost[t_test]),
                  "killed_at_s": round(killed_at - t_sent, 1) if killed else None,
                  "first_drift_at_s": round(first["time"] - t_sent, 1) if first and "time" in first else None,
                  "evaluation_kinds": [j["kind"] for j in st["jobs"]]}  # nothing here called report/tick/evaluate
    finally:  # a run that failed leaves no monitor, Serve or Ray behind either
        subprocess.run([sys.executable, "-m", "proxray.cli", "monitor", "stop", "--name", name,
                        "--address", ctx.address_info["gcs_address"]], capture_output=True, timeout=120)
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    return result


def timeline(versions: list, t0: float, load_router, X, acc, cost) -> list:
    """Each router version the run made: its number, status, why, gate figures, when (seconds after the first
    new-task query) and its AUC on the held-out new-task queries."""
    out = []
    for v in versions:
        try:
            auc = round(auc_on(load_router(v["path"]), X, acc, cost), 2)
        except Exception:  # noqa: BLE001 - a version whose files are gone: shown without its AUC
            auc = None
        out.append({**{k: v.get(k) for k in ("version", "status", "why", "gate")},
                    "at_s": round(v["at"] - t0, 1) if v.get("at") else None, "auc": auc})
    return out


def draw(result: dict, path) -> None:
    """The drift loop of one run as a PNG: each router version's AUC on the held-out new-task queries at the time it
    was made, by what the gate did with it, the served AUC over time, the first drift flagged and the kill."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    vs = [v for v in result["versions"] if v["auc"] is not None]
    end = max([v["at_s"] or 0 for v in vs] + [result.get("absorbed_after_s") or 0]) * 1.08 + 1
    served = sorted((max(v["at_s"] or 0, 0), v["auc"]) for v in vs if v["status"] in ("served", "replaced"))
    xs = [x for x, _ in served] + [end]
    ax.step(xs, [a for _, a in served] + [served[-1][1]], where="post", color="tab:green", alpha=0.5,
            label="served router")
    marks = {"served": ("o", "tab:green", "promoted, served"), "replaced": ("o", "tab:green", "promoted, served"),
             "rejected": ("x", "tab:red", "rejected by the gate"), "candidate": ("s", "tab:gray", "in its window"),
             "rolled_back": ("v", "tab:red", "rolled back")}
    seen = set()
    for v in vs:
        m, c, label = marks.get(v["status"], ("o", "black", v["status"]))
        x = max(v["at_s"] or 0, 0)
        ax.scatter([x], [v["auc"]], marker=m, color=c, s=60, zorder=5, label=None if label in seen else label)
        seen.add(label)
        ax.annotate(f"v{v['version']}", (x, v["auc"]), textcoords="offset points", xytext=(5, 5), fontsize=8)
    for key, style, label in (("first_drift_at_s", "tab:orange", "first query flagged"),
                              ("killed_at_s", "tab:red", "monitor killed")):
        if result.get(key) is not None:
            ax.axvline(result[key], color=style, ls="--", lw=1, label=label)
    ax.set_xlabel(f"seconds after the first {result['task']} query")
    ax.set_ylabel(f"AUC % on held-out {result['task']}")
    ax.set_title(f"proxray demo drift: {result['before']:.1f} % → {result['after']:.1f} %, "
                 f"{result['spent_usd']:.4f} USD spent")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _settled(st: dict) -> bool:
    """Nothing under way: no candidate in its window, no drift or spot evaluation running, no feedback waiting."""
    return (st["gate"]["candidate"] is None and not st["feedback"]["pending"] and
            not any(j["kind"] in ("drift", "spot") and j["status"] in ("SUBMITTING", "RUNNING") for j in st["jobs"]))


def feedback_rounds(client, port, rows, full, acc, cost, batch, status, timeout_s, inverted=False, probes=("hello",)) -> int:
    """Users send ``rows`` of the table in rounds of ``batch``, each with its own λ (a spread of cost preferences), and
    score every answer through POST /v1/feedback (the answer's correctness in the table; ``inverted``: 1 − it, a
    poisoned stream). After each round, wait until the monitor settled it (spot-checked, gated, shadowed, served or
    rejected; ``probes``: the other traffic that goes on meanwhile): the next round is routed by the router then served.
    Returns how many answers were scored."""
    import httpx

    lams = [0.0] + [q / float(np.mean(cost)) for q in (0.05, 0.2, 1.0)]  # users' own λ, cheap to quality-minded
    scored = 0
    for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        for j, i in enumerate(chunk):
            lam = lams[(start + j) % len(lams)]
            r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": full.prompts[i]}],
                                               extra_body={"proxray": {"lam": lam}})
            score = float(acc[i, POOL.index(r.model)])
            score = 1.0 - score if inverted else score
            for _ in range(100):  # the answer is remembered after it is sent
                fb = httpx.post(f"http://127.0.0.1:{port}/v1/feedback", json={"id": r.id, "score": score}, timeout=30)
                if fb.status_code != 404:
                    break
                time.sleep(0.05)
            fb.raise_for_status()
            scored += 1
        want = start + len(chunk)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            st = status()
            fb = st["feedback"]
            if fb["absorbed"] + fb["set_aside"] >= want and _settled(st):
                break
            client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": probes[
                int(time.time() * 2) % len(probes)]}])
            time.sleep(0.5)
        log(f"feedback round: {scored} answers scored, {st['feedback']['absorbed']} added, router v{st['router_version']}")
        for _ in range(60):  # the next round goes to the grown router
            probe = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": "hello"}])
            if probe.model_extra["proxray"]["router_path"] == st["router_path"]:
                break
            time.sleep(0.5)
    return scored


def main(argv=None):
    p = argparse.ArgumentParser(prog="proxray demo drift", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="gsm8k")
    p.add_argument("--n-per-task", type=int, default=60)
    p.add_argument("--min-batch", type=int, default=20)
    p.add_argument("--kill-mid-evaluation", action="store_true", help="kill the monitor actor while its job runs")
    p.add_argument("--labels", choices=["judge", "feedback"], default="judge",
                   help="who labels the new task's queries: a judge of the pool, or the users' feedback")
    p.add_argument("--poison", choices=POISONS, default=None,
                   help="labels that lie: the users' scores inverted (with --labels feedback), or a judge that grades at "
                        "random; the gate keeps the served version")
    p.add_argument("--port", type=int, default=None, help="the endpoint's port on 127.0.0.1 (default: a free one)")
    p.add_argument("--figure", default=None, help="also draw the run's router versions, their AUC and the gate's "
                   "decisions over time as a PNG here")
    a = p.parse_args(argv)
    result = run(a.task, a.n_per_task, a.min_batch, kill_mid_evaluation=a.kill_mid_evaluation, labels=a.labels,
                 poison=a.poison, port=a.port)
    if a.figure:
        draw(result, a.figure)
        log(f"wrote {a.figure}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
