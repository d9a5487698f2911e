"""show: a report's prompts and greedy continuations as text, decoded with a
model directory's tokenizer (the C side prints token ids and points here).

Per run that has data: a header line, then per row the prompt (its stored
prompt_text when the report has one, else its real ids decoded) and the
continuation (the run's tokens decoded). A run whose `tokenizer` attribute
names another vocabulary than the directory's tokenizer is refused: its ids
would decode to wrong text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .errors import InputError


def _attr_text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if hasattr(v, "tobytes") and getattr(v, "dtype", None) is not None and v.dtype.kind == "S":
        return v.tobytes().split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(v)


def _one_line(text: str) -> str:
    # a prompt may hold newlines: shown escaped, one row per line
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def show_report(path: str, tokenizer: Any, model_dir: str) -> Iterator[str]:
    import h5py
    import numpy as np

    from .prompts import tokenizer_identity

    ident = tokenizer_identity(tokenizer, model_dir, True)
    mine = f"vocab={ident['vocab_size']} sha256={ident['vocab_sha256'][:16]}"
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise InputError(f"{path}: not an HDF5 report: {str(e).splitlines()[0][:200]}") from None
    with f:
        runs = f.get("runs")
        if not isinstance(runs, h5py.Group):
            raise InputError(f"{path}: field /runs: missing (not a kvrepro report)")
        for name in runs:
            g = runs[name]
            a = g.attrs
            head = (f"run {name}: {_attr_text(a.get('variant', '?'))} {_attr_text(a.get('backend', '?'))}/"
                    f"{_attr_text(a.get('mode', '?'))}/r{int(a.get('repeat', 0))}")
            if int(a.get("skipped", 0)):
                yield f"{head}: skipped: {_attr_text(a.get('skip_reason', ''))}"
                continue
            if "tokenizer" in a:
                theirs = _attr_text(a["tokenizer"])
                if not theirs.endswith(mine):
                    raise InputError(f"{path}: run {name}: attribute tokenizer: tokenized with {theirs!r}, "
                                     f"{model_dir}'s tokenizer is {mine!r}: give --model the directory "
                                     "the prompts were tokenized with")
            for ds in ("prompt", "prompt_real", "tokens"):
                if ds not in g:
                    raise InputError(f"{path}: run {name}: dataset {ds}: missing")
            prompt = np.asarray(g["prompt"])
            real = np.asarray(g["prompt_real"]).astype(bool)
            tokens = np.asarray(g["tokens"])
            texts = [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
                     for t in g["prompt_text"][()]] if "prompt_text" in g else None
            yield f"{head}: {tokens.shape[0]} steps, {prompt.shape[0]} rows"
            for b in range(prompt.shape[0]):
                ids = [int(x) for x in prompt[b][real[b]]]
                shown = texts[b] if texts is not None and b < len(texts) else tokenizer.decode(ids)
                cont = tokenizer.decode([int(x) for x in tokens[:, b]])
                yield f"  row {b} prompt ({len(ids)} tokens): {_one_line(shown)}"
                yield f"  row {b} continuation: {_one_line(cont)}"
