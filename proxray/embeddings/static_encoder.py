"""A static encoder: one vector per vocabulary token, distilled from a sentence transformer, averaged per text.

``distill(source)`` runs the source model (a local sentence-transformers folder; the shipped MiniLM by default)
once over every token of its vocabulary, each token alone between the tokenizer's special tokens, keeps the
mean-pooled output as that token's vector, reduces the table to ``dims`` with PCA and down-weights frequent
tokens (SIF weights, ``sif / (sif + p(rank))`` with a Zipf estimate of each token's probability from its rank
in the vocabulary) — the model2vec recipe. It is deterministic (fixed order and batches, full SVD) and runs
offline in ~15 s on two cores for MiniLM's 30,522 tokens; the folder (``vectors.npy``, ``tokenizer.json``,
``meta.json``) goes into the proxray cache under the source's content hash and the recipe, written beside and
renamed into place, so concurrent replicas race safely.

``StaticSession`` then needs only numpy and ``tokenizers``: a text's embedding is the unit-normed mean of its
tokens' rows, 0.1–0.4 ms a text on one core (most of it tokenizing; short to long prompts) instead of ~7 ms for
MiniLM on ONNX Runtime. Its routing quality
against MiniLM is measured in ``research/static-encoder.md``.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FORMAT = 1


@dataclass(frozen=True)
class Recipe:
    """How the token table is made: ``dims`` after PCA (None: the model's own width, no PCA), ``sif``
    (frequency weighting's coefficient; 0: none) and ``pooling`` (``mean`` over the token and the special
    tokens around it, or ``token``: the token's own output)."""
    dims: int | None = 256
    sif: float = 1e-4
    pooling: str = "mean"

    def tag(self) -> str:
        """Short and stable: part of the encoder's cache id, so a new recipe never reuses old vectors."""
        return f"d{self.dims or 'full'}-sif{self.sif:g}-{self.pooling}"


DEFAULT_RECIPE = Recipe()


def static_dir(source: str, recipe: Recipe, cache_dir) -> Path:
    from proxray.embeddings.cache import source_fingerprint

    key = json.dumps([FORMAT, source_fingerprint(source), asdict(recipe)])
    return Path(cache_dir) / "static" / hashlib.sha256(key.encode()).hexdigest()[:24]


def distill(source: str, recipe: Recipe = DEFAULT_RECIPE, cache_dir=None, progress: bool = False) -> Path:
    """The folder of ``source``'s static encoder (distilled the first time; later calls only look it up)."""
    from proxray.embeddings.cache import build_folder_once, default_cache_dir

    if recipe.pooling not in ("mean", "token"):
        raise ValueError(f"pooling={recipe.pooling!r}: allowed 'mean', 'token'")
    final = static_dir(source, recipe, cache_dir or default_cache_dir())
    return build_folder_once(final, lambda tmp: _distill_into(source, recipe, tmp, progress), ".distill-")


def token_vectors(st, pooling: str = "mean", batch_size: int = 512, progress: bool = False) -> np.ndarray:
    """(vocabulary size, width): the transformer's output for each token id alone, ``[CLS] t [SEP]``."""
    import torch

    tok = st.tokenizer
    ids = torch.arange(len(tok), dtype=torch.long)[:, None]
    first = [tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id]
    last = [tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id]
    if None in first + last:
        raise ValueError("the static encoder needs a tokenizer with CLS/SEP (or BOS/EOS) tokens")
    model = st[0].auto_model.eval()
    out = np.empty((len(tok), model.config.hidden_size), np.float32)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tok), desc="distilling", unit="token")
    with torch.inference_mode():
        for s in range(0, len(tok), batch_size):
            chunk = ids[s:s + batch_size]
            n = len(chunk)
            x = torch.cat([torch.tensor(first).expand(n, 1), chunk, torch.tensor(last).expand(n, 1)], dim=1)
            h = model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            out[s:s + n] = (h.mean(dim=1) if pooling == "mean" else h[:, 1]).numpy()
            if bar:
                bar.update(n)
    if bar:
        bar.close()
    return out


def post_process(vectors: np.ndarray, recipe: Recipe) -> np.ndarray:
    """PCA to ``recipe.dims`` (full SVD: the same table every time), then SIF weights by vocabulary rank."""
    v = vectors.astype(np.float64)
    if recipe.dims is not None and recipe.dims < v.shape[1]:
        from sklearn.decomposition import PCA

        v = PCA(n_components=recipe.dims, svd_solver="full").fit_transform(v)
    if recipe.sif:
        inv_rank = 1.0 / np.arange(2, len(v) + 2)
        p = inv_rank / inv_rank.sum()
        v *= (recipe.sif / (recipe.sif + p))[:, None]
    return v.astype(np.float32)


def _distill_into(source: str, recipe: Recipe, out: Path, progress: bool) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    st = SentenceTransformer(source, device="cpu")
    if type(st[0]).__name__ != "Transformer" or not getattr(st.tokenizer, "is_fast", False):
        raise ValueError(f"{source}: a static encoder is distilled from a Transformer module with a fast "
                         "tokenizer (tokenizer.json)")
    table = post_process(token_vectors(st, recipe.pooling, progress=progress), recipe)
    np.save(out / "vectors.npy", table)
    st.tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    meta = {"format": FORMAT, "source": source, "recipe": asdict(recipe), "dim": int(table.shape[1]),
            "vocabulary": int(table.shape[0]), "max_tokens": int(st.max_seq_length),
            "special_ids": sorted(int(i) for i in st.tokenizer.all_special_ids),
            "sha256": hashlib.sha256(table.tobytes()).hexdigest(), "torch": torch.__version__}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


class StaticSession:
    """A distilled folder's ``encode(texts) -> (n, d)`` float32 unit vectors: tokenize, average, normalize."""

    def __init__(self, folder):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.meta = json.loads((folder / "meta.json").read_text())
        self.vectors = np.load(folder / "vectors.npy")
        if hashlib.sha256(self.vectors.tobytes()).hexdigest() != self.meta["sha256"]:
            raise ValueError(f"{folder}: vectors.npy does not match its checksum; delete the folder to distil again")
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.max_tokens = self.meta["max_tokens"]
        self.dim = self.meta["dim"]

    CHUNK = 1024  # texts per pass: their token rows (tokens × dim floats) are gathered at once

    def encode(self, texts: list[str]) -> np.ndarray:
        if len(texts) > self.CHUNK:  # memory stays ~CHUNK texts' token rows, whatever the table's size
            return np.concatenate([self.encode(texts[s:s + self.CHUNK]) for s in range(0, len(texts), self.CHUNK)])
        if len(texts) == 1:  # the serving path: no batch dispatch
            encoded = [self.tokenizer.encode(texts[0], add_special_tokens=False)]
        else:
            encoded = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = [e.ids[:self.max_tokens] for e in encoded]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        out = np.zeros((len(texts), self.dim), np.float32)
        full = lengths > 0  # a text without a token stays the zero vector
        if full.any():
            rows = self.vectors[np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))]
            starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            out[full] = np.add.reduceat(rows, starts[full], axis=0) / lengths[full, None]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)
