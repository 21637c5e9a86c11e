"""What a conversation's turn is expected to cost at each model (the cost term of its decision under the cache_aware
rule), against the formula by hand; the rule that keeps or switches on it; the book that remembers what each model's
cache holds of a conversation."""
import numpy as np
import pytest

from proxray.pool.spec import PriceSpec

LARGE = PriceSpec(input_per_mtok=3.0, output_per_mtok=15.0, cache_ttl_s=300)  # reads 0.30, writes 3.75 by default
SMALL = PriceSpec(input_per_mtok=1.0, output_per_mtok=5.0, cache_ttl_s=300, cache_min_tokens=2048)
PRICES = {"large": LARGE, "small": SMALL}
MODELS = ["large", "small"]


def test_a_turn_costs_its_cached_prefix_at_the_read_price_and_the_rest_at_the_write_price():
    from proxray.serve.request.turn_cost import turn_costs

    session = {"model": "small", "cached": {"small": (40_000, 1000.0), "large": (10_000, 1000.0)}, "output_tokens": 300}
    c = turn_costs(MODELS, PRICES, session, 42_000, 4096, {"large": True, "small": True}, now=1100.0)
    # small holds the whole prefix: 40k read at 0.10, 2k written at 1.25, 300 out at 5
    assert c.cost[1] == pytest.approx((40_000 * 0.10 + 2_000 * 1.25 + 300 * 5.0) / 1e6)
    # large holds 10k of it: this turn writes the other 30k of the prefix once, read from then on (horizon 1: now)
    assert c.cost[0] == pytest.approx((10_000 * 0.30 + 32_000 * 3.75 + 300 * 15.0) / 1e6)
    assert c.cached == {"small": 40_000, "large": 10_000} and c.output_tokens == 300
    assert c.full[1] == pytest.approx((42_000 * 1.25 + 300 * 5.0) / 1e6)  # the same turn with nothing cached
    # spread over 4 turns, the one-off write of the prefix costs a quarter of it now
    h = turn_costs(MODELS, PRICES, session, 42_000, 4096, {"large": True, "small": True}, now=1100.0, horizon=4)
    steady = (40_000 * 0.30 + 2_000 * 3.75 + 300 * 15.0) / 1e6
    assert h.cost[0] == pytest.approx(steady + 30_000 * (3.75 - 0.30) / 4 / 1e6)
    assert h.cost[1] == pytest.approx(c.cost[1])  # the conversation's own model pays nothing more


def test_a_cache_past_its_lifetime_or_below_its_minimum_holds_nothing_and_plain_input_is_billed_without_marks():
    from proxray.serve.request.turn_cost import expected_cached, turn_costs

    assert expected_cached(50_000, (40_000, 0.0), LARGE, now=300.0) == 40_000
    assert expected_cached(50_000, (40_000, 0.0), LARGE, now=300.5) == 0  # 5 minutes and a half second: gone
    assert expected_cached(50_000, (1_500, 0.0), SMALL, now=1.0) == 0  # under small's 2,048-token minimum
    assert expected_cached(30_000, (40_000, 0.0), LARGE, now=1.0) == 30_000  # never more than the prompt
    session = {"model": "large", "cached": {"large": (8_000, 0.0)}, "output_tokens": None}
    c = turn_costs(MODELS, PRICES, session, 10_000, 100, {}, now=10.0)  # no cache marks: new tokens at input price
    assert c.cost[0] == pytest.approx((8_000 * 0.30 + 2_000 * 3.0 + 100 * 15.0) / 1e6)  # output: the limit, 100
    assert turn_costs(MODELS, {"large": LARGE}, session, 10_000, 100, {}, now=10.0) is None  # small has no price


@pytest.mark.parametrize("lam,expect", [(1.0, "switched"), (12.0, "kept")])
def test_a_conversation_switches_only_where_the_gain_beats_the_cache_it_gives_up(lam, expect):
    from proxray.serve.request.plan import candidate_order
    from proxray.serve.request.turn_cost import turn_costs
    from proxray.serve.tenancy.conversations import weigh_cache

    acc = np.array([0.90, 0.20])  # a turn the small model is poor at
    session = {"model": "small", "cached": {"small": (20_000, 0.0)}, "output_tokens": 300}
    costs = turn_costs(MODELS, PRICES, session, 22_000, 4096, {"large": True, "small": True}, now=1.0)
    candidates = [MODELS[i] for i in candidate_order(acc, np.array(costs.cost), lam, [True, True])]
    report = weigh_cache(candidates, "small", acc, costs, lam, MODELS)
    gain = (0.90 - lam * costs.cost[0]) - (0.20 - lam * costs.full[1])
    assert report["action"] == expect and report["gain"] == pytest.approx(gain, abs=1e-8)
    assert report["cache_value"] == pytest.approx(lam * (costs.full[1] - costs.cost[1]), abs=1e-8)
    assert (report["gain"] > report["cache_value"]) == (expect == "switched")
    assert candidates[0] == ("large" if expect == "switched" else "small") and report["why"]
    assert report["cache"]["expected_cached_tokens"] == {"small": 20_000}
    assert weigh_cache(["large", "small"], "small", acc, costs, lam, MODELS, tool_loop=True)["action"] == "kept"
    assert weigh_cache(["large"], "small", acc, costs, lam, MODELS)["action"] == "new"


def test_the_book_keeps_per_conversation_and_model_what_was_cached_when():
    from proxray.serve.tenancy.conversations import ConversationBook

    book = ConversationBook(max_entries=10, ttl_s=3600)
    book.remember("c", "small", prompt_tokens=12_000, now=10.0)
    book.told("c", 300)
    book.remember("c", "large", prompt_tokens=14_000, now=20.0)
    book.told("c", 500)
    s = book.session("c", now=30.0)
    assert s == {"model": "large", "cached": {"small": [12_000, 10.0], "large": [14_000, 20.0]}, "output_tokens": 400}
    assert book.recall("c", now=30.0) == "large" and book.session("unknown") is None
    assert book.session("c", now=20.0 + 3601) is None  # idle past ttl_s: forgotten
