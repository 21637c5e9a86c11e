"""Tools for development, tests and demos: ``build_tiny_model`` (``proxray make-tiny-model``), a tiny random causal
LM with a trained tokenizer, made offline, that vLLM and transformers load like any Hugging Face model folder."""
from __future__ import annotations

import os


def build_tiny_model(path, seed: int = 0, vocab_size: int = 512, hidden: int = 64, layers: int = 2,
                     heads: int = 2, kv_heads: int = 1, max_positions: int = 1024) -> str:
    """A tiny Llama-architecture causal LM with a trained byte-level BPE tokenizer and a chat template,
    saved to ``path`` in the Hugging Face layout. Random weights: real code path, not a real model.

    The default head size (hidden / heads = 32) is one vLLM's CPU attention supports (32, 64, 80, ...);
    ``hidden`` and ``layers`` make a wider model for throughput measurements."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from proxray.data.synthetic import generate_queries

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}, and heads of kv_heads={kv_heads}")
    os.makedirs(path, exist_ok=True)
    corpus = generate_queries(30, seed=seed)["prompt"].tolist() + ["The answer is 42.", "(A)", "(B)", "True", "False"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=max_positions)
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)
