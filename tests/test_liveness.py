"""Telling a lost replica from a slow one, on its own: the deployment's heartbeats, the ingress's watched stream over a
scripted deployment stream, the probe's verdicts, and what the fallback loop makes of them (no Ray cluster: the
multi-node case is tests/test_node_loss.py)."""
import asyncio
import time

import pytest
from test_serve_policy import Scripted, answer, run

from proxray.serve.deployments import liveness
from proxray.serve.deployments.liveness import (BEAT, Liveness, ModelUnavailable, ReplicaLost, Unavailable,
                                                WatchedStream, heartbeats, is_beat)
from proxray.serve.errors import RequestError


async def engine(delays, chunks):
    """An engine's stream: each chunk after its delay."""
    for d, c in zip(delays, chunks):
        await asyncio.sleep(d)
        yield c


def test_a_deployment_beats_while_its_engine_is_quiet_and_adds_nothing_to_a_quick_answer():
    async def go(delays, chunks):
        t0 = time.monotonic()
        return [(time.monotonic() - t0, obj) async for obj in heartbeats(engine(delays, chunks), 0.2)]
    got = asyncio.run(go([0.55, 0.0], ["a", "b"]))
    beats = [t for t, o in got if is_beat(o)]
    assert len(beats) == 2 and 0.15 <= beats[0] <= 0.35 and 0.35 <= beats[1] <= 0.6  # every 0.2 s of quiet
    assert [o for _, o in got if not is_beat(o)] == ["a", "b"]  # the chunks unchanged, in order
    assert [o for _, o in asyncio.run(go([0.01, 0.0], ["a", "b"]))] == ["a", "b"]  # a quick answer travels alone


def test_a_caller_that_leaves_closes_the_engines_stream():
    closed = []

    async def slow():
        try:
            await asyncio.sleep(10)
            yield "never"
        finally:
            closed.append(True)

    async def go():
        gen = heartbeats(slow(), 0.05)
        assert await gen.__anext__() == BEAT
        assert await gen.__anext__() == BEAT
        await gen.aclose()
    asyncio.run(go())
    assert closed == [True]


class FakeGen:
    """A deployment stream: objects after delays; ``cancel()`` recorded."""

    def __init__(self, items):
        self.items, self.cancelled = list(items), False

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        delay, obj = self.items.pop(0)
        await asyncio.sleep(delay)
        if isinstance(obj, BaseException):
            raise obj
        return obj

    def cancel(self):
        self.cancelled = True


class Probed(Liveness):
    """A liveness view whose probe answers as told (``alive``), counting the probes."""

    def __init__(self, alive: bool, failover_s=0.3):
        super().__init__("app", {"m": "m", "n": "n"}, failover_s)
        self.alive, self.probes = alive, 0

    async def _probe(self, model):
        self.probes += 1
        return self.alive


def read(stream):
    async def go():
        return [obj async for obj in stream]
    return asyncio.run(go())


def test_a_slow_model_that_took_the_request_and_beats_is_never_cut_off():
    live = Probed(alive=True)
    # 1.2 s before its answer, four times the failover time, but beating every 0.2 s
    items = [(0.2, BEAT)] * 6 + [(0.0, answer("m"))]
    assert read(WatchedStream(FakeGen(items), "m", live, patient=False)) == [answer("m")]
    assert live.probes == 0 and live.down == {} and live.slow == {}


def test_a_model_that_goes_silent_after_taking_the_request_is_given_up_and_probed():
    async def go():
        live = Probed(alive=False)
        gen = FakeGen([(0, {"choices": []}), (10, answer("m"))])
        s = WatchedStream(gen, "m", live, patient=True)  # even the last candidate: its replica is gone
        assert await s.__anext__() == {"choices": []}
        t0 = time.monotonic()
        with pytest.raises(ReplicaLost, match="went silent"):
            await s.__anext__()
        waited = time.monotonic() - t0
        s.cancel()
        await asyncio.sleep(0.05)  # the probe it started
        return waited, live, gen
    waited, live, gen = asyncio.run(go())
    assert 0.25 <= waited <= 0.6 and gen.cancelled
    assert "m" in live.down and live.probes == 1
    assert isinstance(live.unavailable("m"), ModelUnavailable) and live.order(["m", "n"]) == ["n", "m"]


def test_a_model_that_does_not_take_a_request_is_passed_over_unless_it_is_the_last_and_alive():
    async def not_taken(alive, patient, items):
        live = Probed(alive=alive)
        s = WatchedStream(FakeGen(items), "m", live, patient=patient)
        t0 = time.monotonic()
        try:
            return await s.__anext__(), time.monotonic() - t0, live
        except Exception as e:  # noqa: BLE001
            return e, time.monotonic() - t0, live

    # a candidate with others behind it: given up after failover_s, whatever the probe will say; tried last then
    got, waited, live = asyncio.run(not_taken(True, False, [(2.0, BEAT)]))
    assert isinstance(got, ReplicaLost) and 0.25 <= waited <= 0.6 and live.order(["m", "n"]) == ["n", "m"]
    # the last candidate, with a live replica (busy, or starting): waited for
    got, waited, live = asyncio.run(not_taken(True, True, [(0.7, BEAT), (0, answer("m"))]))
    assert got == answer("m") and waited >= 0.65 and live.probes >= 1 and "m" not in live.down
    # the last candidate, no live replica: a ModelUnavailable, and the model down
    got, waited, live = asyncio.run(not_taken(False, True, [(5.0, BEAT)]))
    assert isinstance(got, ModelUnavailable) and "no live replica" in str(got) and waited <= 0.6
    assert "m" in live.down


def test_a_replica_ray_says_died_is_probed_but_leaves_its_model_first():
    """Ray says the replica that had the request died: Serve's router has dropped it and the model's other replicas
    take its requests, so the model keeps its place (a conversation keeps its model); the probe says if any is left."""
    from ray.exceptions import ActorDiedError

    async def go(alive):
        live = Probed(alive=alive)
        with pytest.raises(ActorDiedError):
            await WatchedStream(FakeGen([(0, ActorDiedError())]), "m", live, patient=False).__anext__()
        await asyncio.sleep(0.05)  # the probe it started
        return live
    live = asyncio.run(go(True))
    assert live.probes == 1 and live.slow == {} and live.order(["m", "n"]) == ["m", "n"]
    live = asyncio.run(go(False))  # none left: down, and tried last
    assert live.probes == 1 and "m" in live.down and live.order(["m", "n"]) == ["n", "m"]


def test_a_probe_finding_a_live_replica_brings_a_model_back(monkeypatch):
    monkeypatch.setattr(liveness, "PROBE_S", 0.0)  # no probe reuse between the two asks

    async def go():
        live = Probed(alive=False)
        assert not await live.live("m") and "m" in live.down
        live.alive = True
        await asyncio.sleep(0.01)
        assert await live.live("m")
        return live
    live = asyncio.run(go())
    assert live.down == {} and live.unavailable("m") is None
    assert Liveness(None, {}, 1.0).order(["a", "b"]) == ["a", "b"]  # in-process models: nothing watched


def test_concurrent_asks_share_one_probe():
    async def go():
        live = Probed(alive=True)
        assert all(await asyncio.gather(*(live.live("m") for _ in range(20))))
        return live.probes
    assert asyncio.run(go()) == 1


def test_a_named_model_without_a_live_replica_is_a_503_naming_it_with_retry_after():
    for failure in (ModelUnavailable("a", "none answered for 2.0 s"), ReplicaLost("model 'a' went silent for 1 s")):
        with pytest.raises(RequestError) as e:
            run(Scripted({"a": failure}), ["a"])
        assert e.value.status == 503 and e.value.param == "model" and "'a'" in e.value.message
        assert e.value.headers == {"retry-after": "1"} and e.value.kind == "service_unavailable"
    # routed: the next candidate answers; the last candidate alone is patient
    client = Scripted({"a": ReplicaLost("model 'a' did not take the request within 1 s"), "b": [answer("b")]})
    (model, _, _), p, failed = run(client, ["a", "b"])
    assert model == "b" and p.report["fallback_from"] == ["a"] and client.patient == [False, True]
    assert "ReplicaLost" in failed[0][1]


def test_a_model_known_down_fails_at_once():
    async def go():
        with pytest.raises(ModelUnavailable):
            await Unavailable(ModelUnavailable("a", "none answered for 1.0 s")).__anext__()
    t0 = time.monotonic()
    asyncio.run(go())
    assert time.monotonic() - t0 < 0.1


def test_candidates_that_lost_their_replica_are_asked_again_until_one_is_back():
    """Every candidate's replica died under the request (Ray's actor error: Serve replaces it): the request asks them
    again, a quarter second apart, and is answered by the first back — not refused."""
    from ray.exceptions import ActorDiedError

    class Restarting(Scripted):
        def __init__(self, script, dead_for: int):
            super().__init__(script)
            self.dead_for = dead_for

        def stream(self, model, endpoint, body, patient=True):
            if len(self.asked) < self.dead_for:
                self.asked.append((model, body["model"]))
                return Scripted({model: ActorDiedError()}).stream(model, endpoint, body, patient)
            return super().stream(model, endpoint, body, patient)

    # each model asked twice a pass (its other replicas first): a pass and a quarter
    client = Restarting({"a": [answer("a")], "b": [answer("b")]}, dead_for=5)
    (model, head, _), p, failed = run(client, ["a", "b"])
    assert model == "a" and len(failed) == 5 and [m for m, _ in client.asked] == ["a", "a", "b", "b", "a", "a"]
    assert p.report["fallback_from"] == ["a", "b"]  # each model once, however often it was asked
    with pytest.raises(RequestError) as e:  # a model with no replica to come is not waited for
        run(Scripted({"a": ModelUnavailable("a", "none answered for 2.0 s")}), ["a"])
    assert e.value.status == 503


def test_readiness_names_the_models_still_starting_until_each_has_run_and_then_stops_asking(monkeypatch):
    """``/health``'s answer while the app starts: the models whose deployment has no RUNNING replica yet, the
    controller asked at most once a second; once every one has run, ready for good (a model lost later is the
    liveness check's, not a reason to call the gateway unready); a controller that does not answer: still starting."""
    from proxray.serve.deployments import readiness

    views = iter([{"A": 1, "B": 0}, {"A": 0, "B": 1}, RuntimeError("controller away")])
    asked = []

    def running(app):
        asked.append(app)
        view = next(views)
        if isinstance(view, Exception):
            raise view
        return view

    monkeypatch.setattr(readiness, "running_replicas", running)
    clock = [100.0]
    monkeypatch.setattr(readiness.time, "monotonic", lambda: clock[0])
    r = readiness.Readiness("app", {"a": "A", "b": "B"})

    async def go():
        out = [await r.starting()]
        out.append(await r.starting())  # within the second: not asked again
        clock[0] += 1.0
        out.append(await r.starting())  # b has run now; a was seen running before: ready
        clock[0] += 5.0
        out.append(await r.starting())  # never asked again, whatever the controller says
        return out

    assert asyncio.run(go()) == [["b"], ["b"], [], []] and asked == ["app", "app"]
    views = iter([RuntimeError("controller away")])
    assert asyncio.run(readiness.Readiness("app", {"a": "A"}).starting()) == ["a"]
    assert asyncio.run(readiness.Readiness(None, {"a": "A"}).starting()) == []  # no Serve app: nothing to wait on
