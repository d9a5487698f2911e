"""Prompts files, and text in: the gate's --prompts file and the capture's.

Two forms are read (harness/prompts.c reads the same):
  - a JSON array of token-id arrays, one per row (left-padded as a batch);
  - one JSON object
        {"format": "kvrepro-prompts", "version": 1,
         "prompts": [[2, 651, ...], ...],          required: the rows' token ids
         "texts": ["...", ...],                   optional: one string per row
         "tokenizer": {"name": ..., "vocab_size": ..., "vocab_sha256": ...,
                       "add_special_tokens": true}}   optional
    with no other key.
`kvrepro-hf prompts` writes the object form from texts, tokenized with the
model directory's own tokenizer as transformers' generate would see them
(add_special_tokens=True: Gemma's BOS).

vocab_sha256 is the sha256 of the tokenizer's vocabulary as compact UTF-8
JSON of its (token, id) pairs in id order, so that a report can say which
tokenizer its ids belong to without holding the vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .names import MAX_PROMPT_LEN, MAX_PROMPT_ROWS, MAX_PROMPTS_BYTES, MAX_TEXT_BYTES

FORMAT = "kvrepro-prompts"
VERSION = 1
KEYS = ("format", "version", "prompts", "texts", "tokenizer")
TOKENIZER_KEYS = ("name", "vocab_size", "vocab_sha256", "add_special_tokens")
# The files whose presence makes a directory's tokenizer (AutoTokenizer reads one of them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
# --text-file: prompts are separated by a line holding only this.
SEPARATOR = "---"


@dataclass
class PromptsFile:
    prompts: list[list[int]]
    texts: list[str] | None = None
    tokenizer: dict[str, Any] | None = None

    def tokenizer_text(self) -> str:
        """The report's /runs/NNNN/tokenizer attribute: "<name> vocab=<V> sha256=<16 hex>"."""
        t = self.tokenizer or {}
        return f"{t.get('name', '?')} vocab={t.get('vocab_size', '?')} sha256={str(t.get('vocab_sha256', '?'))[:16]}"


def _check_rows(path: str, rows: Any, where: str) -> list[list[int]]:
    if not isinstance(rows, list) or not rows:
        raise InputError(f"{path}: {where}expected a non-empty JSON array of token-id arrays")
    if len(rows) > MAX_PROMPT_ROWS:
        raise InputError(f"{path}: {where}{len(rows)} prompts, above the {MAX_PROMPT_ROWS} rows a run may have")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not row:
            raise InputError(f"{path}: {where}prompt {i}: expected a non-empty array of token ids")
        if len(row) > MAX_PROMPT_LEN:
            raise InputError(f"{path}: {where}prompt {i}: {len(row)} tokens, above the {MAX_PROMPT_LEN} a "
                             "prompt may have")
        for j, t in enumerate(row):
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t > 2**31 - 1:
                raise InputError(f"{path}: {where}prompt {i} token {j}: expected a token id (integer >= 0)")
    return rows


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_tokenizer(path: str, t: Any) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise InputError(f"{path}: field tokenizer: expected an object")
    for k in t:
        if k not in TOKENIZER_KEYS:
            raise InputError(f"{path}: field tokenizer.{k}: unknown key (expected {', '.join(TOKENIZER_KEYS)})")
    name = t.get("name")
    if not isinstance(name, str) or not name or len(name.encode("utf-8", "replace")) > 255:
        raise InputError(f"{path}: field tokenizer.name: expected a string of 1 to 255 bytes")
    if not _is_int(t.get("vocab_size")) or not 1 <= t["vocab_size"] <= 2**31 - 1:
        raise InputError(f"{path}: field tokenizer.vocab_size: expected an integer >= 1")
    sha = t.get("vocab_sha256")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise InputError(f"{path}: field tokenizer.vocab_sha256: expected 64 lowercase hex digits")
    if "add_special_tokens" in t and not isinstance(t["add_special_tokens"], bool):
        raise InputError(f"{path}: field tokenizer.add_special_tokens: expected true or false")
    return t


def parse_prompts_file(path: str, data: bytes) -> PromptsFile:
    """Either form, within the reader's bounds."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:   # trailing content included
        raise InputError(f"{path}: not JSON: {e}") from None
    except RecursionError:
        raise InputError(f"{path}: not a prompts file: arrays nested too deeply") from None
    if not isinstance(obj, dict):
        return PromptsFile(_check_rows(path, obj, ""))
    for k in obj:
        if k not in KEYS:
            raise InputError(f"{path}: field {str(k)[:64]!r}: unknown key (a prompts object has "
                             f"{', '.join(KEYS)})")
    if obj.get("format") != FORMAT:
        raise InputError(f"{path}: field format: expected {FORMAT!r}, found {json.dumps(obj.get('format'))[:40]}")
    if not _is_int(obj.get("version")) or obj["version"] != VERSION:
        raise InputError(f"{path}: field version: expected {VERSION}, found {json.dumps(obj.get('version'))[:40]}")
    if "prompts" not in obj:
        raise InputError(f"{path}: field prompts: missing")
    rows = _check_rows(path, obj["prompts"], "field prompts: ")
    texts = obj.get("texts")
    if texts is not None:
        if not isinstance(texts, list) or len(texts) != len(rows):
            raise InputError(f"{path}: field texts: expected an array of {len(rows)} strings (one per prompt)")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"{path}: field texts: entry {i}: expected a string")
    tok = _check_tokenizer(path, obj["tokenizer"]) if obj.get("tokenizer") is not None else None
    return PromptsFile(rows, texts, tok)


def check_text(text: str, where: str) -> str:
    """A prompt text: not empty (nor only whitespace), valid UTF-8, at most MAX_TEXT_BYTES."""
    if not text.strip():
        raise InputError(f"{where}: an empty text (a prompt needs at least one character that is not a space)")
    try:
        n = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InputError(f"{where}: not valid UTF-8") from None
    if n > MAX_TEXT_BYTES:
        raise InputError(f"{where}: {n} bytes, above the {MAX_TEXT_BYTES >> 20} MiB a prompt text may have")
    return text


def parse_text_file(path: str, data: bytes) -> list[str]:
    """A UTF-8 text file of prompts separated by lines holding only `---`;
    each prompt is the lines between, joined by newlines (the newline
    before a separator or the end belongs to the file, not the prompt)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text: byte {e.start}") from None
    if "\x00" in text:
        raise InputError(f"{path}: not a text file (it holds NUL bytes)")
    prompts: list[str] = []
    cur: list[str] = []
    start = 1
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()   # the final newline ends the last line
    for n, line in enumerate(lines, 1):
        if line.rstrip("\r") == SEPARATOR:
            prompts.append(check_text("\n".join(cur), f"{path}: prompt {len(prompts)} (lines {start}-{n - 1})"))
            cur, start = [], n + 1
        else:
            cur.append(line)
    prompts.append(check_text("\n".join(cur), f"{path}: prompt {len(prompts)} (lines {start}-{len(lines)})"))
    if len(prompts) > MAX_PROMPT_ROWS:
        raise InputError(f"{path}: {len(prompts)} prompts, above the {MAX_PROMPT_ROWS} rows a run may have")
    return prompts


def vocab_sha256(tokenizer: Any) -> str:
    pairs = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def tokenizer_identity(tokenizer: Any, model_dir: str, add_special_tokens: bool) -> dict[str, Any]:
    return {"name": os.path.basename(os.path.abspath(model_dir)) or str(tokenizer.name_or_path),
            "vocab_size": len(tokenizer.get_vocab()), "vocab_sha256": vocab_sha256(tokenizer),
            "add_special_tokens": add_special_tokens}


def check_has_tokenizer(model_dir: str) -> None:
    if not os.path.isdir(model_dir):
        raise InputError(f"{model_dir}: not a directory")
    if not any(os.path.isfile(os.path.join(model_dir, n)) for n in TOKENIZER_FILES):
        raise InputError(f"{model_dir}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}): give a model "
                         "directory with its tokenizer, or token ids with --prompts")


def load_tokenizer(model_dir: str) -> Any:
    """The directory's own tokenizer (AutoTokenizer), offline."""
    check_has_tokenizer(model_dir)
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:   # a damaged tokenizer file: bad input
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise InputError(f"{model_dir}: transformers cannot load its tokenizer: {type(e).__name__}: {first}") from None


def tokenize(model_dir: str, texts: list[str], add_special_tokens: bool = True,
             vocab: int | None = None) -> PromptsFile:
    """The texts as the gate's prompts, with the tokenizer's identity."""
    tok = load_tokenizer(model_dir)
    rows = []
    for i, t in enumerate(texts):
        ids = tok(t, add_special_tokens=add_special_tokens)["input_ids"]
        if not ids:
            raise InputError(f"text {i}: the tokenizer of {model_dir} gives no tokens")
        if len(ids) > MAX_PROMPT_LEN:
            raise InputError(f"text {i}: {len(ids)} tokens, above the {MAX_PROMPT_LEN} a prompt may have")
        if vocab is not None and max(ids) >= vocab:
            raise InputError(f"text {i}: token id {max(ids)} is not below the model's vocab_size {vocab} "
                             f"({model_dir}/config.json)")
        rows.append([int(x) for x in ids])
    return PromptsFile(rows, list(texts), tokenizer_identity(tok, model_dir, add_special_tokens))


def dump_prompts_file(pf: PromptsFile) -> bytes:
    """The object form, one prompt row per line."""
    parts = [f'{{"format": "{FORMAT}", "version": {VERSION},', ' "prompts": [']
    parts.append(",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in pf.prompts))
    parts.append(" ]")
    if pf.texts is not None:
        parts[-1] += ","
        parts.append(' "texts": [')
        parts.append(",\n".join("  " + json.dumps(t, ensure_ascii=False) for t in pf.texts))
        parts.append(" ]")
    if pf.tokenizer is not None:
        parts[-1] += ","
        parts.append(' "tokenizer": ' + json.dumps(pf.tokenizer, ensure_ascii=False))
    parts.append("}")
    data = ("\n".join(parts) + "\n").encode("utf-8")
    if len(data) > MAX_PROMPTS_BYTES:
        raise InputError(f"the prompts file would be {len(data)} bytes, above the {MAX_PROMPTS_BYTES >> 20} MiB "
                         "a prompts file may have")
    return data
