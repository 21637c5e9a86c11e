"""Every router hyperparameter is stated once (proxray.routing.params): the classes' signatures, make_router,
get_params(), the command line's options and the configuration reference all say what the spec says; validation
happens once, in fit, every problem at once; get_params() returns what was passed."""
import inspect
from pathlib import Path

import pytest

from conftest import blobs
from proxray import KMeansRouter, KNNRouter
from proxray.cli import build_parser
from proxray.routing.params import check_fit
from proxray.routing.registry import SPECS
from proxray.routing.registry import ROUTERS, make_router
from proxray.routing.temperature import Spread

ROOT = Path(__file__).resolve().parents[1]


def _subparser(name):
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "cmd")
    return action.choices[name]


@pytest.mark.parametrize("kind", ["knn", "km"])
def test_every_default_and_option_is_the_specs(kind):
    spec = SPECS[kind]
    cls = ROUTERS[kind]
    signature = {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
                 if n not in ("self", "deprecated")}
    assert signature == {name: p.default for name, p in spec.items()}
    assert make_router(kind).get_params() == signature
    reference = (ROOT / "docs" / "reference" / "config.md").read_text()
    for name, p in spec.items():
        assert f"| `{name}` | `{p.default!r}` |" in reference, name
    for command in ("fit", "eval"):
        options = {a.option_strings[0]: a for a in _subparser(command)._actions if a.option_strings}
        for p in spec.values():
            if p.cli in options:
                assert options[p.cli].default == p.default, (command, p.cli)
                if p.choices:
                    assert tuple(options[p.cli].choices) == p.choices
    fit_options = {a.option_strings[0] for a in _subparser("fit")._actions if a.option_strings}
    assert {p.cli for p in spec.values() if p.cli} <= fit_options


def test_get_params_returns_what_was_passed(rng):
    X, acc, cost, _ = blobs(rng)
    for given in ("spread:0.2", 20.0, Spread(0.3), "auto"):
        r = KNNRouter(k=7, temperature=given)
        assert r.get_params()["temperature"] is given
        r.fit(X, acc, cost)
        assert r.get_params()["temperature"] is given and r.get_params()["k"] == 7
    assert KNNRouter(temperature="auto").fit(X, acc, cost).temperature_.spec == "spread:0.2"
    r = KMeansRouter().set_params(n_clusters=5, temperature=20)
    assert r.get_params()["n_clusters"] == 5 and r.fit(X, acc, cost).temperature_.spec == "fixed:20"


def test_validated_once_in_fit_every_problem_at_once(rng):
    X, acc, cost, _ = blobs(rng, n_per=5)
    r = KNNRouter(k=0, recall_floor=2.0, metric="manhattan", hnsw_m=1)  # construction validates nothing
    with pytest.raises(ValueError) as e:
        r.fit(X, acc, cost)
    msg = str(e.value)
    assert "k=0: must be an integer from 1 to the training queries' number (20); pass k=20" in msg
    assert "recall_floor=2.0: must be a number from 0 to 1" in msg
    assert "metric='manhattan': allowed values are cosine, euclidean" in msg and "hnsw_m=1: must be an integer >= 2" in msg
    with pytest.raises(ValueError, match="n_clusters=21: must be an integer from 1 to the training queries' number "
                                         r"\(20\); pass n_clusters=20"):
        KMeansRouter(n_clusters=21).fit(X, acc, cost)
    with pytest.raises(ValueError, match="prior='flat': allowed values are spread, size, uniform"):
        KMeansRouter(n_clusters=3, prior="flat").fit(X, acc, cost)


def test_check_fit_names_the_options_as_the_command_line_spells_them():
    with pytest.raises(ValueError, match="--clusters 50: must be an integer from 1 to the training queries' number "
                                         r"\(40\); pass --clusters 32"):
        check_fit(KMeansRouter, {"n_clusters": 50}, 40, 3, spelled={"n_clusters": "--clusters "})
    with pytest.raises(ValueError, match="typo: not a parameter of knn routers"):
        check_fit(KNNRouter, {"typo": 1}, 40, 3)
    check_fit(KNNRouter, {"k": 40, "recall_floor": 0.9}, 40, 3)
    assert make_router("km", hp={"n_clusters": 5, "k": 3}).get_params()["n_clusters"] == 5  # k is kNN's: ignored
    assert make_router("km", hp={"n_clusters": 500}, n_train=40).n_clusters == 40
