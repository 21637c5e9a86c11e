import numpy as np

from proxray import SentenceEncoder


def test_minilm_embeddings_are_unit_and_semantic(encoder):
    X = encoder.encode(["How many apples are left if I eat two of five?",
                        "If I have five apples and eat two, how many remain?",
                        "Which river flows through Paris?"])
    assert X.shape == (3, 384) and X.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    assert X[0] @ X[1] > X[0] @ X[2] + 0.3
    assert encoder.id == "sentence-transformers/all-MiniLM-L6-v2" and encoder.dim == 384


def test_cache_encodes_each_text_once(tmp_path):
    texts = ["alpha beta", "gamma delta", "alpha beta"]
    first = SentenceEncoder(cache=tmp_path / "c.sqlite")
    a = first.encode(texts)
    np.testing.assert_array_equal(a[0], a[2])
    second = SentenceEncoder(cache=tmp_path / "c.sqlite")
    b = second.encode(texts)
    assert second._model is None  # everything came from the cache: the model was never loaded
    np.testing.assert_allclose(a, b, atol=1e-7)
    # another encoder id never reads these vectors
    other = SentenceEncoder(cache=tmp_path / "c.sqlite")
    other.id = "another-encoder"
    assert other.cache.get("another-encoder", texts) == {}
