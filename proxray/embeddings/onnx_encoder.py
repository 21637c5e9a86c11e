"""The same sentence-transformers encoder, run by ONNX Runtime (the serving path's fast encoder).

``export(source)`` traces the whole sentence-transformers pipeline (transformer, pooling, normalization)
of a local model folder or name to one ONNX graph with ``torch.onnx`` — once, offline, nothing downloaded
— and saves it with the model's ``tokenizer.json`` and a ``meta.json`` into a folder of the proxray cache
keyed on the source's content, written beside and renamed into place (concurrent replicas race safely).
``quantize="int8"`` adds ONNX Runtime's dynamic int8 quantization of the weight matrices, except the
feed-forward output projections (their inputs, GELU outputs, have the outliers that per-tensor dynamic
activation scales lose): cosine to fp32 0.9967 mean / 0.988 min on 1,200 of the shared tables' prompts
instead of 0.9929 / 0.974 when every weight matrix is quantized, at the same speed (``INT8_RECIPE``).

``OnnxSession`` then needs only ``onnxruntime`` and ``tokenizers``: no torch, no sentence-transformers.
fp32 output equals the torch encoder's to float precision (cosine ≥ 0.99999, tested); int8 is an
approximation whose routing quality ``bench/bench_encoder.py`` measures.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from proxray.embeddings.cache import source_fingerprint

FORMAT = 1
QUANTIZE = (None, "int8")
INT8_RECIPE = "weights-except-ffn-out"  # part of the export key and of the int8 embeddings' cache id


def export_dir(source: str, quantize: str | None, cache_dir: Path) -> Path:
    import onnxruntime

    recipe = INT8_RECIPE if quantize else None
    key = json.dumps([FORMAT, source_fingerprint(source), quantize, onnxruntime.__version__]
                     + ([recipe] if recipe else []))
    return Path(cache_dir) / "onnx" / hashlib.sha256(key.encode()).hexdigest()[:24]


def _traceable(st, names):
    """The sentence-transformers modules as one traceable function of the tokenizer's tensors."""
    import torch

    class Pipeline(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.st = st

        def forward(self, *tensors):
            return self.st(dict(zip(names, tensors)))["sentence_embedding"]

    return Pipeline().eval()


def export(source: str, quantize: str | None = None, cache_dir=None) -> Path:
    """The folder holding ``model.onnx``, ``tokenizer.json`` and ``meta.json`` for ``source`` (exported
    the first time; later calls only look it up)."""
    from proxray.embeddings.cache import build_folder_once, default_cache_dir

    if quantize not in QUANTIZE:
        raise ValueError(f"quantize={quantize!r}: allowed {QUANTIZE}")
    final = export_dir(source, quantize, cache_dir or default_cache_dir())
    return build_folder_once(final, lambda tmp: _export_into(source, quantize, tmp), ".export-")


def _export_into(source: str, quantize: str | None, out: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(source, device="cpu")
    modules = [type(m).__name__ for m in st]
    if modules[0] != "Transformer" or any(m not in ("Pooling", "Normalize") for m in modules[1:]):
        raise ValueError(f"{source}: the ONNX backend exports Transformer + Pooling (+ Normalize) pipelines; "
                         f"this model has {modules} (use backend='torch')")
    tok = st.tokenizer
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{source}: the ONNX backend needs a fast tokenizer (tokenizer.json); use backend='torch'")
    example = tok(["a sentence to trace the graph with", "and a second one"], return_tensors="pt", padding=True)
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in example]
    fp32 = out / ("model_fp32.onnx" if quantize else "model.onnx")
    pipeline, args = _traceable(st, names), tuple(example[n] for n in names)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about Python control flow in the model code
        dim = int(pipeline(*args).shape[-1])
        torch.onnx.export(pipeline, args, str(fp32), input_names=names,
                          output_names=["sentence_embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names},
                                        "sentence_embedding": {0: "batch"}})
    if quantize == "int8":
        _quantize_int8(fp32, out / "model.onnx")
        fp32.unlink()
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    meta = {"format": FORMAT, "source": source, "quantize": quantize,
            "recipe": INT8_RECIPE if quantize else None, "inputs": names,
            "max_seq_length": int(st.max_seq_length), "pad_id": int(tok.pad_token_id or 0),
            "pad_token": tok.pad_token or "[PAD]", "dim": dim,
            "torch": torch.__version__}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def _quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 (per-channel weight scales) of the MatMuls with a weight matrix, except the
    feed-forward output projections (``INT8_RECIPE``); activation × activation products stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    ffn_out = lambda n: n.endswith("/output/dense/MatMul") and "/attention/" not in n  # noqa: E731 - BERT naming
    nodes = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights and not ffn_out(n.name)]
    if not nodes:
        raise ValueError(f"{src}: no MatMul with a weight matrix to quantize")
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True, nodes_to_quantize=nodes)


class OnnxSession:
    """Tokenizer + ONNX Runtime session for an exported folder: ``encode(texts) -> (n, d)`` float32."""

    def __init__(self, folder, threads: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.meta = json.loads((folder / "meta.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.meta["max_seq_length"])
        self.tokenizer.enable_padding(pad_id=self.meta["pad_id"], pad_token=self.meta["pad_token"])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or min(2, os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        # idle threads sleep instead of spinning: a replica shares its CPUs with the proxy and the models
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3
        self.session = ort.InferenceSession(str(folder / "model.onnx"), so, providers=["CPUExecutionProvider"])
        self.dim = self.meta["dim"]

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        enc = self.tokenizer.encode_batch(texts)
        feeds = {"input_ids": np.array([e.ids for e in enc], np.int64),
                 "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
                 "token_type_ids": np.array([e.type_ids for e in enc], np.int64)}
        out = self.session.run(None, {n: feeds[n] for n in self.meta["inputs"]})[0]
        return np.asarray(out, np.float32)
