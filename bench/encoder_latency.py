"""How long does one routing text take to encode, per encoder variant? (not a timed test)

    python bench/encoder_latency.py [--n 200] [--threads 2] [--variants onnx,onnx-int8,torch,torch-bf16,static]
                                    [--lengths short,long]

One text at a time, as the ingress encodes a lone routed request, in this process on an idle machine: the
demo's never-seen prompts (``bench_serve.py``'s new texts: ``generate_queries`` seeds 1000+), p50 / p90 ms of
the whole ``encode`` (tokenize, forward, pool, normalize) and each variant's cosine to torch fp32. ``--lengths``:
``short``, the prompts as they are (~40 tokens); ``long``, four of them in one text (~160 tokens). ``static`` is the
static encoder distilled from the shipped MiniLM (its vectors are of another size: no cosine).
``torch-bf16`` is the same sentence-transformers model cast to bfloat16 (oneDNN's AVX-512 BF16 kernels
where the CPU has them): a candidate fast path that keeps fp32's vectors far closer than int8 does.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def variants(names, threads):
    import torch

    from proxray.embeddings.encoder import SentenceEncoder

    torch.set_num_threads(threads)
    out = {}
    for name in names:
        if name == "static":
            enc = SentenceEncoder("static", cache=False, progress=False)
        elif name == "torch-bf16":
            enc = SentenceEncoder(cache=False, progress=False)
            enc.model.to(torch.bfloat16)
        else:
            enc = SentenceEncoder(backend=name, cache=False, progress=False, threads=threads)
        out[name] = enc
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200, help="texts timed per variant")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--variants", default="onnx,onnx-int8,torch,torch-bf16")
    p.add_argument("--lengths", default="short", help="short, long or both (comma-separated)")
    a = p.parse_args(argv)
    import torch

    from proxray.data.synthetic import generate_queries

    short = list(dict.fromkeys(q for s in range(1000, 1100) for q in generate_queries(40, seed=s).prompt))[:4 * a.n]
    encs = variants(["torch"] + [v for v in a.variants.split(",") if v != "torch"], a.threads)
    tok = encs["torch"].model.tokenizer
    for length in a.lengths.split(","):
        texts = short[:a.n] if length == "short" else [" ".join(short[i:i + 4]) for i in range(0, 4 * a.n, 4)]
        print(f"\n{length}: {len(texts)} texts, {np.median([len(tok(t)['input_ids']) for t in texts]):.0f} tokens "
              f"median (with [CLS] / [SEP]), {a.threads} threads")
        ref = encs["torch"].encode(texts)
        print("| variant | p50 ms | p90 ms | cosine to torch fp32: mean / min |\n|---|---|---|---|")
        for name, enc in encs.items():
            if name == "torch" and "torch" not in a.variants.split(","):
                continue  # the reference for the cosines only
            with torch.inference_mode():
                for t in texts[:20]:
                    enc.encode([t])  # warm-up
                ms = []
                for t in texts:
                    t0 = time.perf_counter()
                    enc.encode([t])
                    ms.append(1000 * (time.perf_counter() - t0))
                got = enc.encode(texts)
            cos = (got * ref).sum(1) if got.shape == ref.shape else None
            print(f"| {name} | {np.percentile(ms, 50):.2f} | {np.percentile(ms, 90):.2f} | "
                  + (f"{cos.mean():.5f} / {cos.min():.5f} |" if cos is not None else "— |"), flush=True)

if __name__ == "__main__":
    main()
