"""The static encoder distilled from the shipped MiniLM: made offline and deterministically, equal to its
formula (the unit-normed mean of the text's token rows), an ordinary encoder id for routers, the CLI and
serving (inline on the event loop, over HTTP on 127.0.0.1)."""
import json

import numpy as np
import pytest

from proxray import KNNRouter, SentenceEncoder
from proxray.embeddings.static_encoder import DEFAULT_RECIPE, Recipe, StaticSession, distill, post_process


@pytest.fixture(scope="module")
def static():
    return SentenceEncoder("static", progress=False)


def test_the_static_encoder_is_an_encoder_id_distilled_into_the_cache(static):
    import os
    from pathlib import Path

    assert static.id == "static:sentence-transformers/all-MiniLM-L6-v2" and static.dim == 256
    assert Path(static.static_folder).parent.parent == Path(os.environ["PROXRAY_CACHE"])
    meta = json.loads((static.static_folder / "meta.json").read_text())
    assert meta["recipe"] == {"dims": 256, "sif": 1e-4, "pooling": "mean"} and meta["vocabulary"] == 30522
    # the backend does not matter to a static encoder: one set of vectors, one cache id with the recipe in it
    other = SentenceEncoder("static", backend="onnx", cache=False)
    assert other.backend == "static" and other._cache_id == f"{static.id}/{DEFAULT_RECIPE.tag()}"
    assert SentenceEncoder(f"static:{static._source}").static_folder is None  # lazy: nothing distilled yet
    with pytest.raises(ValueError, match="not from another static encoder"):
        SentenceEncoder("static:static")


def test_a_text_is_the_unit_normed_mean_of_its_token_rows(static):
    s = static.static_session
    texts = ["What is the capital of France?", "def f(x): return x ** 2", "", "Ünïcödé and emoji 🙂"]
    got = static.encode(texts)
    for text, v in zip(texts, got):
        ids = s.tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            assert not v.any()  # no token: the zero vector, routed like any far-away text
            continue
        want = s.vectors[ids].mean(0)
        np.testing.assert_allclose(v, want / np.linalg.norm(want), atol=1e-6)
    # paraphrases are closer than unrelated texts
    a, b, c = static.encode(["How many apples does Tom have left?", "How many apples are left with Tom?",
                             "Translate this sentence into German."])
    assert a @ b > a @ c + 0.2


def test_post_processing_is_pca_then_frequency_weights():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(300, 12)).astype(np.float32)
    out = post_process(v, Recipe(dims=4, sif=1e-2))
    from sklearn.decomposition import PCA

    pca = PCA(n_components=4, svd_solver="full").fit_transform(v.astype(np.float64))
    p = 1 / np.arange(2, 302)
    p /= p.sum()
    np.testing.assert_allclose(out, pca * (1e-2 / (1e-2 + p))[:, None], rtol=1e-5, atol=1e-6)
    assert post_process(v, Recipe(dims=None, sif=0)).tobytes() == v.tobytes()


@pytest.mark.slow
def test_distilling_again_gives_the_same_table(static, tmp_path):
    again = distill(static._source, cache_dir=tmp_path)
    assert json.loads((again / "meta.json").read_text())["sha256"] == \
        json.loads((static.static_folder / "meta.json").read_text())["sha256"]
    (again / "vectors.npy").write_bytes((static.static_folder / "vectors.npy").read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match="checksum"):
        StaticSession(again)


def test_routers_fit_on_it_and_refuse_another_encoder(static, encoder, tmp_path):
    from proxray.pool.simulated import make_table
    from proxray.routing.registry import load_router

    table = make_table(10)
    acc, cost = table.matrices()
    KNNRouter(k=10).fit(static.encode(table.prompts), acc, cost, encoder_id=static.id).save(tmp_path / "r")
    r = load_router(tmp_path / "r", encoder_id=static.id)
    assert r.encoder_id_ == static.id
    with pytest.raises(ValueError, match="static:sentence-transformers/all-MiniLM-L6-v2"):
        load_router(tmp_path / "r", encoder_id=encoder.id)


@pytest.mark.slow
def test_the_endpoint_routes_with_it_inline(static, tmp_path):
    """An app whose encoder is static encodes a new text on the event loop (no thread hop, no batch) and
    estimates what the router estimates for the static vectors; a repeat comes from the LRU."""
    from openai import OpenAI

    from proxray.routing.registry import load_router
    from serve_helpers import STRONG, WEAK, start_app, stop_app

    fast = {"min_replicas": 1, "max_replicas": 1}
    url = start_app(tmp_path, static, [{"id": m, "engine": "sim", "autoscaling": fast} for m in (WEAK, STRONG)],
                    encoder="static")
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=30)
        text = "A train leaves at 3 pm going 60 km/h; when has it covered 150 km?"
        reps = [client.chat.completions.create(model="proxray", messages=[{"role": "user", "content": text}])
                .model_extra["proxray"] for _ in range(2)]
        first, second = (r["timings"] for r in reps)
        assert first["embedding_cache"] == "miss" and first["encoder_batch"] == 0  # inline
        assert second["embedding_cache"] == "hit" and "encode_ms" not in second
        router = load_router(reps[0]["router_path"])
        assert router.encoder_id_ == static.id
        acc, _ = router.estimate(static.encode([text]))
        got = {m: e["accuracy"] for m, e in reps[0]["estimates"].items()}
        assert got == pytest.approx({m: float(acc[0, router.models_.index(m)]) for m in got}, abs=1e-5)
    finally:
        stop_app()


def test_the_monitor_embeds_with_the_routers_own_encoder(static, tmp_path):
    """A router fitted on the static encoder: the monitor's training embeddings and its reports are static ones."""
    from proxray.pool.simulated import make_table
    from proxray.demos.drift import POOL, job_template
    from proxray.monitor import DriftMonitor

    table = make_table(10)
    table.write(tmp_path / "t.parquet")
    acc, cost = table.matrices(models=POOL)
    router = KNNRouter(k=10).fit(static.encode(table.prompts), acc, cost, models=POOL, encoder_id=static.id)
    router.save(tmp_path / "r0")
    mon = DriftMonitor({"router": str(tmp_path / "r0"), "table": str(tmp_path / "t.parquet"),
                        "state_dir": str(tmp_path / "state"), "job": job_template(), "submit": "inline"})
    assert mon.encoder.id == static.id and mon.detector.threshold > 0
    text = "A brand-new question about tide tables?"
    x = static.encode([text])[0]
    mon.report(text, x, float(router.outlier_score(x[None])[0]))
    assert mon.status()["reported"] == 1


def test_it_uses_the_on_disk_cache_for_batches_only(tmp_path):
    """A static encoder encodes one text faster than the cache commits it: a single text is not written; a batch is,
    and is read back."""
    import sqlite3

    from proxray.embeddings.encoder import STATIC_CACHE_MIN_BATCH

    enc = SentenceEncoder("static", cache=tmp_path / "e.sqlite", progress=False)

    def rows():
        with sqlite3.connect(tmp_path / "e.sqlite") as db:
            return db.execute("SELECT COUNT(*) FROM emb").fetchone()[0]

    one = enc.encode(["How many moons does Mars have?"])
    assert rows() == 0
    texts = [f"Question {i}: what is {i} plus {i + 1}?" for i in range(STATIC_CACHE_MIN_BATCH)]
    batch = enc.encode(texts)
    assert rows() == STATIC_CACHE_MIN_BATCH
    enc.static_session.encode = lambda t: pytest.fail("encoded again")  # the batch now comes from the cache
    np.testing.assert_array_equal(enc.encode(texts), batch)
    np.testing.assert_allclose(one, SentenceEncoder("static", cache=False).encode(["How many moons does Mars have?"]))


def test_a_large_batch_is_encoded_in_chunks_of_bounded_memory(static, monkeypatch):
    """Texts beyond ``CHUNK`` go through in passes (a 10⁵-prompt table gathered every token row at once: ~26 GB),
    with the same vectors as one text at a time."""
    session = static.static_session
    texts = [f"Prompt {i}: " + "compute the derivative of x squared " * (i % 5 + 1) for i in range(11)]
    one_by_one = np.concatenate([session.encode([t]) for t in texts])
    monkeypatch.setattr(session, "CHUNK", 4)
    np.testing.assert_allclose(session.encode(texts), one_by_one, atol=1e-6)
