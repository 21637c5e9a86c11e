"""Router families describe themselves: a third one (tests/toy_router.py) is one file and one registry line, and the
command line, the fit recipe, the evaluation protocols, temperatures and artifacts take it; the two shipped families
are named only in their own modules."""
import re

import numpy as np
import pytest

from conftest import ROOT, blobs
from toy_router import FewNeighboursRouter


@pytest.fixture
def registered():
    from proxray.routing import registry

    saved = (list(registry.FAMILIES), *(dict(d) for d in (registry.ROUTERS, registry.NAMES, registry.LABELS,
                                                           registry.SPECS, registry.CLASSES)))
    yield registry.register(FewNeighboursRouter)  # the one registry line
    registry.FAMILIES[:] = saved[0]
    for d, old in zip((registry.ROUTERS, registry.NAMES, registry.LABELS, registry.SPECS, registry.CLASSES), saved[1:]):
        d.clear()
        d.update(old)


def test_a_registered_family_is_made_fitted_saved_and_loaded_by_its_short_name(registered, rng, tmp_path):
    from proxray.routing.fitting import FitSettings
    from proxray.routing.registry import load_router, make_router

    X, acc, cost, _ = blobs(rng)
    r = make_router("few")
    assert type(r) is FewNeighboursRouter and r.get_params() == {"k": 5, "weighting": "prox", "temperature": "auto",
                                                                 "metric": "cosine"}
    assert FitSettings(router="few").router == "few"
    r = make_router("few", hp={"k": 7, "n_clusters": 9}).fit(X, acc, cost)  # another family's setting is ignored
    assert r.k == 7 and r.temperature_.spec == "fixed:5"
    r.save(tmp_path / "few")
    back = load_router(tmp_path / "few")
    assert type(back) is FewNeighboursRouter and np.array_equal(back.route(X[:20], 0.0), r.route(X[:20], 0.0))
    with pytest.raises(ValueError, match=r"k=0: must be an integer from 1"):
        make_router("few", hp={"k": 0}).fit(X, acc, cost)


def test_its_temperatures_are_the_ones_it_declares(registered):
    from proxray.routing.registry import family
    from proxray.routing.temperature import parse_temperature

    few = family("few")
    assert parse_temperature("auto", few).spec == "fixed:5" and parse_temperature("20", few).spec == "fixed:20"
    with pytest.raises(ValueError, match=r"spread:0.2' does not apply to router='few': its temperatures are fixed"):
        parse_temperature("spread:0.2", few)


def test_the_protocols_and_the_command_line_take_it(registered, rng):
    from proxray.cli import build_parser
    from proxray.experiments.protocols import evaluate

    X, acc, cost, labels = blobs(rng, n_per=40)
    tasks = np.array([f"task{i}" for i in labels])
    res = evaluate(X, acc, cost, tasks, router="few", protocol=FewNeighboursRouter.protocol, outliers=["task3"],
                   seeds=(1,))
    assert res["router"] == "few" and res["temperature"] == ["fixed:5"]
    assert 0 <= res["splits"]["overall"]["prox"] <= 100
    a = build_parser().parse_args(["fit", "--router", "few", "--out", "r"])
    assert a.router == "few"


def test_unregistered_it_is_refused_by_name():
    from proxray.routing.fitting import FitSettings
    from proxray.routing.registry import make_router

    with pytest.raises(ValueError, match=r"router='few': allowed values are km, knn"):
        make_router("few")
    with pytest.raises(ValueError, match=r"router='few': allowed values are km, knn"):
        FitSettings(router="few")


def test_the_shipped_families_are_named_only_in_their_own_modules():
    own = {ROOT / "proxray/routing/knn.py", ROOT / "proxray/routing/kmeans.py"}
    named = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "proxray").rglob("*.py"))
             if p not in own and re.search(r"""["'](km|knn)["']""", p.read_text())]
    assert named == []


@pytest.mark.slow
def test_a_registered_family_is_served_over_http(registered, tmp_path, encoder):
    """Its artifact served: the app's replicas register the family (``build(args, families=…)``) and route with it."""
    import httpx

    from proxray.data.synthetic import generate_queries
    from proxray.routing.registry import make_router
    from serve_helpers import PROFILE, STRONG, WEAK, start_app, stop_app

    q = generate_queries(8, seed=1)
    rng = np.random.default_rng(0)
    models = [WEAK, STRONG]
    acc = np.stack([rng.uniform(size=len(q)) < PROFILE[m][0] for m in models], 1).astype(float)
    cost = np.tile([PROFILE[m][1] for m in models], (len(q), 1))
    make_router("few").fit(encoder.encode(list(q.prompt)), acc, cost, models=models,
                           encoder_id=encoder.id).save(tmp_path / "few")
    url = start_app(tmp_path, encoder, [{"id": m, "engine": "sim"} for m in models], router=str(tmp_path / "few"),
                    families=(FewNeighboursRouter,))  # its workers import this module: the tests' folder on their path
    try:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "proxray", "messages": [{"role": "user", "content": q.prompt.iloc[0]}]})
        assert r.status_code == 200, r.text
        report = r.json()["proxray"]
        assert report["model"] in models and r.json()["model"] == report["model"]
        assert set(report["estimates"]) == set(models)  # routed by the family's router
    finally:
        stop_app()
