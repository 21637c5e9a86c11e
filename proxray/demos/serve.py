"""``proxray demo serve``: a routed answer from a fresh install, in one command. It fits the router a Serve config
names where none is there yet (kNN, k = 50, on the embedded synthetic table, over the config's models), serves the
config, asks it one question through the openai client, prints who answered and why (the routing report), and stops
it — or keeps it serving (``--keep``). The serving half is the CLI's (``proxray serve``, supervised); this module
holds what is the demo's own: the router it fits, the question and what it prints."""
from __future__ import annotations

import os
import sys

QUESTION = "What is 17 * 23?"
FIT_K = 50  # the README's own `proxray fit --router knn --k 50`


def app_args(config: dict) -> dict:
    """The first application's ``args`` in a Serve config (the one the demo asks)."""
    apps = config.get("applications") or []
    if not apps or not isinstance(apps[0].get("args"), dict):
        raise SystemExit("proxray demo serve: the config has no application with args (applications[0].args)")
    return apps[0]["args"]


def base_url(config: dict) -> str:
    http = config.get("http_options") or {}
    host = http.get("host", "127.0.0.1")
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{http.get('port', 8000)}"


def ensure_router(config: dict) -> str:
    """The router the config names, fitted where it is missing (a local folder only); says what it did."""
    args = app_args(config)
    router = args.get("router")
    if not isinstance(router, str) or "://" in router:
        return f"router: {router} (the config's)"
    path = router if os.path.isabs(router) else os.path.join(os.getcwd(), router)
    if os.path.exists(path):
        return f"router: {router} (already fitted)"
    from proxray.pool.simulated import make_table
    from proxray.routing.fitting import FitSettings, fit_table
    from proxray.routing.knn import KNNRouter

    models = [m["id"] for m in args.get("models") or [] if isinstance(m, dict) and "id" in m]
    print(f"fitting a kNN router (k={FIT_K}) on the embedded SYNTHETIC routing table over {len(models)} models -> "
          f"{router}", file=sys.stderr)
    r = fit_table(make_table(), FitSettings(router=KNNRouter.kind, models=models or None, hyperparameters={"k": FIT_K}))
    r.save(path)
    return f"router: {router} (fitted now)"


def healthy(url: str) -> bool:
    """Whether ``GET /health`` says 200 now (the standard library's client: the plain install has no httpx)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ask(url: str, question: str = QUESTION) -> dict:
    """One chat completion of the routed model, and what the answer says of its routing."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=os.environ.get("PROXRAY_API_KEY", "unused"), max_retries=2,
                    timeout=120)
    r = client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": question}])
    report = (r.model_extra or {}).get("proxray") or {}
    return {"question": question, "model": r.model, "answer": r.choices[0].message.content or "", "report": report}


def describe(result: dict) -> str:
    """What a newcomer reads: the question, who answered, the answer, and the router's reasons."""
    rep = result["report"]
    lines = [f"asked:       {result['question']}",
             f"answered by: {result['model']}",
             f"answer:      {result['answer'].strip()[:300]}"]
    estimates = rep.get("estimates") or {}
    if estimates:
        lines.append(f"why:         λ = {rep.get('lam')}, outlier score {rep.get('outlier_score', 0):.3f}; the router's "
                     "estimates (accuracy, USD a query), best first:")
        for model, est in estimates.items():
            mark = "→" if model == result["model"] else " "
            lines.append(f"  {mark} {model:<40} {est['accuracy']:.3f}  {est['cost']:.2e}")
    return "\n".join(lines)
