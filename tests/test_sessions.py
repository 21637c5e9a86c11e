"""A coding agent's session over HTTP (the anthropic SDK against the app, two hosted models on a stand-in that bills
prompt caching as Anthropic documents it, tests/cache_standin.py): with the growing context cached on its model, a turn
stays there while the other model's gain is below the cache it would give up, and switches when λ makes the gain worth
more; the report says, per turn, the tokens expected cached and why; the key is charged what the stand-in would
have billed had its cache missed (a hosted provider's cache is every key's: reads charged as the writes they spare)."""
import pytest

from cache_standin import PRICES, CacheStandIn
from openai_standin import key_file
from serve_helpers import ledger, start_app, stop_app

pytestmark = pytest.mark.slow

LARGE, SMALL = "claude-large", "claude-small"
PROFILE = {LARGE: (0.9, 0.012), SMALL: (0.3, 0.004)}  # the table's: accuracy and a short query's cost
KEYS: dict = {}


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("sessions")
    upstream, upstream_file = key_file(tmp)
    standin = CacheStandIn(upstream)
    f = tmp / "keys.yaml"
    KEYS["dev"] = new_key_entry(f, "dev", budget={"usd": 10.0})
    models = [{"id": m, "engine": "openai", "source": m, "base_url": standin.url, "protocols": ["messages"],
               "api_key_file": str(upstream_file),
               "price": {"input_per_mtok": PRICES[m]["input"], "output_per_mtok": PRICES[m]["output"]}}
              for m in (LARGE, SMALL)]
    url = start_app(tmp, encoder, models, profile=PROFILE, keys_file=str(f), timeout_s=60)
    yield url, standin
    stop_app()
    standin.stop()


def test_a_session_stays_on_its_cached_model_until_the_gain_beats_the_cache_then_switches(app):
    from anthropic import Anthropic

    url, standin = app
    client = Anthropic(base_url=url, api_key=KEYS["dev"], max_retries=0, timeout=60)
    system = [{"type": "text", "text": "You are a coding agent. " * 2000, "cache_control": {"type": "ephemeral"}}]
    messages, reports, before = [], [], len(standin.billed)
    # λ 200: cost decides, the small model; then λ 0.5: accuracy decides, the large model's gain beats the cache
    for i, lam in enumerate([200, 200, 200, 0.5, 0.5]):
        for m in messages:
            for b in m["content"]:
                b.pop("cache_control", None)
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"<system-reminder>\n{'line of src/app.py ' * 400}{i}\n</system-reminder>"},
            {"type": "text", "text": f"Fix the failing test number {i}.", "cache_control": {"type": "ephemeral"}}]})
        m = client.messages.create(model="proxray", max_tokens=1024, system=system, messages=messages,
                                   extra_headers={"X-Claude-Code-Session-Id": "session-1"},
                                   extra_body={"proxray": {"lam": lam}})
        reports.append(m.model_extra["proxray"])
        messages.append({"role": "assistant", "content": [{"type": "text", "text": m.content[0].text}]})
    convs = [r["conversation"] for r in reports]
    assert [r["model"] for r in reports] == [SMALL, SMALL, SMALL, LARGE, LARGE]
    assert [c["action"] for c in convs] == ["new", "kept", "kept", "switched", "kept"]
    assert all(c["rule"] == "cache_aware" for c in convs[1:]) and convs[0]["rule"] == "first_turn"
    # the cached prefix the app expected on the session's model is the last turn's prompt, within 2 % of the tokens
    # the stand-in read from its cache
    billed = standin.billed[before:]
    for c, (model, usage, _) in zip(convs[1:3], billed[1:3]):
        assert model == SMALL
        assert c["cache"]["expected_cached_tokens"][SMALL] == pytest.approx(usage["cache_read_input_tokens"], rel=0.02)
        assert c["gain"] < c["cache_value"] and "no more than" in c["why"]
    assert convs[3]["gain"] > convs[3]["cache_value"] and "more than its cache is worth" in convs[3]["why"]
    assert billed[3][1].get("cache_read_input_tokens", 0) == 0 and billed[3][1]["cache_creation_input_tokens"] > 0
    assert billed[4][0] == LARGE and billed[4][1]["cache_read_input_tokens"] > 0  # now cached on the large model
    # what the key is charged is what the stand-in would have billed had its cache held nothing of the key's turns: a
    # hosted provider's cache is every key's, so a read is charged as the write a miss makes (never under the bill)
    missed = sum(standin.bill(model, {**u, "cache_read_input_tokens": 0, "cache_creation_input_tokens":
                                      u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)})
                 for model, u, _ in billed)
    assert ledger("dev")["spent_usd"] == pytest.approx(missed, rel=1e-6) and missed > sum(usd for _, _, usd in billed)
