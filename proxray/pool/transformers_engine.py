"""Real generation on a CPU (or any torch device) with a Hugging Face causal LM: the ``transformers`` engine of the
job and the app (torch and transformers are imported when one is built)."""
from __future__ import annotations

from proxray.pool.engine import Finish, cut_at_stop
from proxray.pool.spec import Sampling


class TransformersEngine:
    """Real generation on CPU (or any torch device) with a Hugging Face causal LM from ``source``
    (a local folder or a Hub id). Prompts go through the tokenizer's chat template when it has one."""

    def __init__(self, source: str, device: str = "cpu", batch_size: int = 8, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(source)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        self.model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype)).to(device).eval()
        self.device, self.batch_size = device, batch_size

    def _text(self, prompt: str) -> str:
        return self._render([{"role": "user", "content": prompt}])

    def _render(self, messages) -> str:
        """The model's input for a conversation: its chat template over every message, or the plain
        text of the messages when the tokenizer has no template."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages)

    def stream(self, messages, prompt, sampling: Sampling = Sampling(), stop=()):
        """Serving: generate for a conversation (its chat template over all messages) or a raw ``prompt``,
        yielding text as tokens come out of ``generate`` (a ``TextIteratorStreamer``), then a ``Finish``.
        A stop string ends the text before it and halts generation at the next token."""
        import threading

        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        text = prompt if messages is None else self._render(messages)
        enc = self.tokenizer([text], return_tensors="pt", add_special_tokens=False).to(self.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        halt, result = threading.Event(), {}

        class Halt(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                return halt.is_set()

        def run():
            try:
                torch.manual_seed(sampling.seed)
                with torch.no_grad():
                    result["ids"] = self.model.generate(
                        **enc, max_new_tokens=sampling.max_tokens, do_sample=sampling.temperature > 0,
                        temperature=sampling.temperature if sampling.temperature > 0 else None,
                        top_p=sampling.top_p if sampling.temperature > 0 else None, top_k=None, streamer=streamer,
                        stopping_criteria=StoppingCriteriaList([Halt()]), pad_token_id=self.tokenizer.pad_token_id)
            except Exception as e:  # noqa: BLE001 - re-raised in the caller's thread below
                result["error"] = e
                streamer.end()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        acc, sent, stopped = "", 0, False
        hold = max((len(s) - 1 for s in stop if s), default=0)  # a tail that may begin a stop string
        for piece in streamer:
            if stopped:
                continue  # drain what comes after the halt
            acc += piece
            cut = cut_at_stop(acc, stop)
            if cut >= 0:
                halt.set()
                stopped, acc = True, acc[:cut]
                if len(acc) > sent:
                    yield acc[sent:]
                sent = len(acc)
            elif len(acc) - hold > sent:
                yield acc[sent:len(acc) - hold]
                sent = len(acc) - hold
        if not stopped and len(acc) > sent:
            yield acc[sent:]
        worker.join()
        if "error" in result:
            raise result["error"]
        new = result["ids"][0, enc["input_ids"].shape[1]:]
        eos = (new == self.tokenizer.eos_token_id).nonzero()
        n_out = int(eos[0, 0]) + 1 if len(eos) else len(new)
        reason = "stop" if stopped or len(eos) else ("length" if n_out >= sampling.max_tokens else "stop")
        yield Finish(int(enc["input_ids"].shape[1]), n_out, reason)

    def generate(self, rows, sampling: Sampling = Sampling()):
        import torch

        out = []
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s:s + self.batch_size]
            enc = self.tokenizer([self._text(r["prompt"]) for r in chunk], return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
            torch.manual_seed(sampling.seed)
            with torch.no_grad():
                gen = self.model.generate(**enc, max_new_tokens=sampling.max_tokens,
                                          do_sample=sampling.temperature > 0,
                                          temperature=sampling.temperature if sampling.temperature > 0 else None,
                                          top_p=None, top_k=None,
                                          pad_token_id=self.tokenizer.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            for i in range(len(chunk)):
                ids = new[i]
                eos = (ids == self.tokenizer.eos_token_id).nonzero()
                n_out = int(eos[0, 0]) + 1 if len(eos) else int((ids != self.tokenizer.pad_token_id).sum())
                out.append({"response": self.tokenizer.decode(ids[:n_out], skip_special_tokens=True),
                            "input_tokens": int(enc["attention_mask"][i].sum()), "output_tokens": n_out})
        return out
