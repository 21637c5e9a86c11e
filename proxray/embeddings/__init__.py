"""Sentence embeddings for routing: the encoder (sentence-transformers, with its disk cache and LRU) and the
serving path's ONNX Runtime build of the same model (``onnx_encoder``)."""
