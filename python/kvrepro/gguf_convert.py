"""convert-gguf: a GGUF checkpoint (llama.cpp's format) turned into a
dequantized Hugging Face directory the gate and the capture read:
config.json with every field resolved, model.safetensors (F32 or BF16), the
tokenizer (tokenizer.json, tokenizer_config.json).

The header is read here first, by this module's own parser, so that a bad
file is refused with the field that is wrong (magic, version, a truncated
header or tensor, a tensor type the dequantizer lacks, a missing or unknown
general.architecture, a missing shape key) before transformers sees it.
transformers itself then dequantizes (`from_pretrained(..., gguf_file=...)`,
gguf's dequantizer), undoes llama.cpp's permutation of the llama q/k rows
(convert_hf_to_gguf.py LlamaModel.permute) and Gemma's norm weights stored as
w + 1 (convert_hf_to_gguf.py Gemma2Model); `save_pretrained` refuses a model
loaded from GGUF, so the directory is written here.

The directory is built in "<out>.tmp-<pid>" beside --out and renamed at the
end: --out is either absent or complete.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .errors import InputError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# general.architecture -> the reference's family (model/config.c). Mistral
# has no architecture of its own in llama.cpp: convert_hf_to_gguf.py writes
# MistralForCausalLM as "llama" (transformers reads it back as mistral when
# general.name is "mistral"). gpt-oss is left out: transformers 5.23's GGUF
# loader has no tensor processor under the file's name "gpt-oss" and no GGUF
# name for GptOssForCausalLM's fused mlp.experts.gate_up_proj and expert
# biases, so those would stay unloaded.
SUPPORTED_ARCHS = ("llama", "gemma2", "gemma3", "qwen2")

# The GGML tensor types gguf 0.19.0's dequantizer (gguf.quants.dequantize,
# what transformers calls) handles; test_gguf_convert dequantizes one block
# of each. Left out, with no dequantizer there: Q8_1, Q8_K (llama.cpp's
# dot-product intermediates), I8..I64, F64, Q1_0.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                   "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S",
                   "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4", "NVFP4")

# The metadata keys without which transformers would fall back to a config
# class default (another checkpoint's shape), "{arch}." prefixed.
REQUIRED_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
                 "attention.head_count", "attention.layer_norm_rms_epsilon")

# Bounds on what a header may claim, so that a damaged count cannot make the
# parser allocate or loop without end (llama.cpp's gguf.cpp has the same kind).
MAX_KV = 1 << 20
MAX_TENSORS = 1 << 20
MAX_STRING = 1 << 30
MAX_ARRAY = 1 << 26
MAX_DIMS = 4

# GGUF value types (gguf.GGUFValueType): code -> struct format; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int


@dataclass
class GgufHeader:
    path: str
    version: int
    size: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0


class _Truncated(Exception):
    pass


class _Reader:
    """Reads the header sequentially, naming the field being read when the
    file ends (a truncated header)."""

    def __init__(self, f: BinaryIO, path: str):
        self.f, self.path, self.pos = f, path, 0
        self.field = "header"

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise InputError(f"{self.path}: truncated: the file ends inside {self.field} (byte {self.pos + len(b)})")
        self.pos += n
        return b

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        if n > MAX_STRING:
            raise InputError(f"{self.path}: field {self.field}: a string of {n} bytes (a damaged header)")
        b = self.take(n)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return b.decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.scalar("<I")
            n = self.scalar("<Q")
            if n > MAX_ARRAY:
                raise InputError(f"{self.path}: field {self.field}: an array of {n} values (a damaged header)")
            if etype in _SCALARS:   # one read for the whole array
                fmt = _SCALARS[etype]
                size = struct.calcsize(fmt)
                raw = self.take(n * size)
                return list(struct.unpack(f"<{n}{fmt[1]}", raw))
            if etype == _ARRAY:
                raise InputError(f"{self.path}: field {self.field}: nested arrays are not GGUF")
            return [self.value(etype) for _ in range(n)]
        raise InputError(f"{self.path}: field {self.field}: unknown value type {vtype}")


def _type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown type id {type_id}"


def _tensor_bytes(info: TensorInfo) -> int | None:
    """Bytes of the tensor's data, or None for a type gguf does not know."""
    import gguf

    try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(info.type_id)]
    except (ValueError, KeyError):
        return None
    n = 1
    for d in info.shape:
        n *= d
    return (n + block - 1) // block * type_size


def read_header(path: str) -> GgufHeader:
    """The header of the GGUF file at path: magic, version, metadata and
    tensor infos, every tensor's data inside the file. InputError (naming
    path and the field) for anything else."""
    from .files import open_regular

    fd = open_regular(path, "GGUF file")
    try:
        size = os.fstat(fd).st_size
        with os.fdopen(fd, "rb", closefd=False) as f:
            r = _Reader(f, path)
            r.field = "magic"
            magic = f.read(4)
            if magic != GGUF_MAGIC:
                raise InputError(f"{path}: field magic: expected {GGUF_MAGIC!r} (a GGUF file), found {magic!r}")
            r.pos = 4
            r.field = "version"
            version = r.scalar("<I")
            if version not in GGUF_VERSIONS:
                raise InputError(f"{path}: field version: expected one of {GGUF_VERSIONS}, found {version}")
            h = GgufHeader(path=path, version=version, size=size)
            r.field = "tensor_count"
            n_tensors = r.scalar("<Q")
            r.field = "kv_count"
            n_kv = r.scalar("<Q")
            if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
                raise InputError(f"{path}: field tensor_count/kv_count: {n_tensors}/{n_kv}, above "
                                 f"{MAX_TENSORS}/{MAX_KV} (a damaged header)")
            for i in range(n_kv):
                r.field = f"metadata key {i}"
                key = r.string()
                r.field = key
                vtype = r.scalar("<I")
                h.metadata[key] = r.value(vtype)
            for i in range(n_tensors):
                r.field = f"tensor info {i}"
                name = r.string()
                r.field = f"tensor {name}"
                n_dims = r.scalar("<I")
                if not 1 <= n_dims <= MAX_DIMS:
                    raise InputError(f"{path}: tensor {name}: {n_dims} dimensions, expected 1..{MAX_DIMS}")
                shape = tuple(r.scalar("<Q") for _ in range(n_dims))
                h.tensors.append(TensorInfo(name, shape, r.scalar("<I"), r.scalar("<Q")))
            align = h.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
            if not isinstance(align, int) or align <= 0 or align & (align - 1):
                raise InputError(f"{path}: field general.alignment: expected a power of two, found {align!r}")
            h.data_start = (r.pos + align - 1) // align * align
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    return h


def check_header(h: GgufHeader) -> str:
    """What convert-gguf needs of the header, checked before transformers
    reads the file; returns general.architecture."""
    path = h.path
    for t in h.tensors:
        nbytes = _tensor_bytes(t)
        tname = _type_name(t.type_id)
        if nbytes is None or tname not in SUPPORTED_TYPES:
            raise InputError(f"{path}: tensor {t.name}: type {tname} cannot be dequantized (gguf "
                             f"{_gguf_version()} dequantizes {', '.join(SUPPORTED_TYPES)})")
        end = h.data_start + t.offset + nbytes
        if end > h.size:
            raise InputError(f"{path}: truncated: tensor {t.name}'s data ends at byte {end}, the file has {h.size}")
    n_split = h.metadata.get("split.count")
    if isinstance(n_split, int) and n_split > 1:
        raise InputError(f"{path}: field split.count: {n_split}: one part of a split GGUF file (merge it "
                         "first: llama.cpp's llama-gguf-split --merge)")
    arch = h.metadata.get("general.architecture")
    if arch is None:
        raise InputError(f"{path}: field general.architecture: missing")
    if arch == "gpt-oss":
        raise InputError(f"{path}: field general.architecture: 'gpt-oss' is not supported: transformers 5.23's "
                         "GGUF loader leaves its fused expert tensors (mlp.experts.gate_up_proj and the expert "
                         f"biases) unloaded; supported: {', '.join(SUPPORTED_ARCHS)}")
    if arch not in SUPPORTED_ARCHS:
        raise InputError(f"{path}: field general.architecture: {str(arch)[:64]!r} has no family in the "
                         f"reference; supported: {', '.join(SUPPORTED_ARCHS)}")
    for k in REQUIRED_KEYS:
        if f"{arch}.{k}" not in h.metadata:
            raise InputError(f"{path}: field {arch}.{k}: missing")
    # RoPE scaling: transformers 5.23's GGUF reader reads neither the scaling
    # keys (Gemma 3 4B's linear factor 8) nor llama.cpp's rope_freqs tensor
    # (Llama 3.1's llama3 scaling), so the converted model would rotate
    # differently from the trained one, silently: refused instead
    scaling = h.metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise InputError(f"{path}: field {arch}.rope.scaling.type: {str(scaling)[:32]!r}: RoPE scaling is not "
                         "carried over by transformers' GGUF reader (nor supported by the reference)")
    if any(t.name == "rope_freqs.weight" for t in h.tensors):
        raise InputError(f"{path}: tensor rope_freqs.weight: RoPE frequency factors (llama3 scaling) are not "
                         "carried over by transformers' GGUF reader (nor supported by the reference)")
    for k in ("tokenizer.ggml.model", "tokenizer.ggml.tokens"):
        if k not in h.metadata:
            raise InputError(f"{path}: field {k}: missing (convert-gguf writes the tokenizer too)")
    return arch


def _gguf_version() -> str:
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:
        return "(unknown version)"


def _check_out(out: str) -> None:
    """--out: a new name or an empty directory."""
    if os.path.islink(out) or (os.path.lexists(out) and not os.path.isdir(out)):
        raise InputError(f"{out}: --out must be a new name or an empty directory, found a file or a link")
    if os.path.isdir(out) and os.listdir(out):
        raise InputError(f"{out}: --out is a directory that is not empty (convert-gguf does not overwrite)")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise InputError(f"{out}: cannot create: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot create: {parent} is not writable")


def _attention_scalar(arch: str, md: dict[str, Any], head_dim: int, hidden: int, heads: int) -> int:
    """Gemma's query_pre_attn_scalar, which the GGUF file does not store:
    llama.cpp (src/llama-model.cpp, f_attention_scale) scales by
    1/sqrt(head_dim), except the 27B models (46 Gemma 2 layers, 62 Gemma 3
    layers), scaled by 1/sqrt(hidden / heads), as their configs say."""
    layers = md[f"{arch}.block_count"]
    big = (arch == "gemma2" and layers == 46) or (arch == "gemma3" and layers == 62)
    return hidden // heads if big else head_dim


def _f32_decimal(v: float) -> float:
    import numpy as np

    return float(np.format_float_positional(np.float32(v), unique=True, trim="-"))


def _resolve_config(arch: str, md: dict[str, Any], config: Any, model_class: str, sliding_window: int | None,
                    dtype_name: str) -> dict[str, Any]:
    """config.json: the loaded config with what transformers' GGUF reader
    leaves at the class default set from the file, and the window given."""
    import transformers

    d = config.to_dict()
    d["architectures"] = [model_class]
    for k in ("quantization_config", "_name_or_path"):
        d.pop(k, None)
    # llama.cpp stores these as float32: written as the shortest decimal that
    # is that float32 (1e-06, as the original config says, not
    # 9.999999974752427e-07); the model adds them in float32 either way
    for k in ("rms_norm_eps",):
        if isinstance(d.get(k), float):
            d[k] = _f32_decimal(d[k])
    if arch in ("gemma2", "gemma3"):
        # transformers 5.23's GGUF config mapping reads neither of these
        d["query_pre_attn_scalar"] = _attention_scalar(arch, md, d["head_dim"], d["hidden_size"],
                                                       d["num_attention_heads"])
        if arch == "gemma2":
            for k in ("attn_logit_softcapping", "final_logit_softcapping"):
                if f"gemma2.{k}" in md:
                    d[k] = _f32_decimal(float(md[f"gemma2.{k}"]))
    if sliding_window is not None:
        max_pos = d.get("max_position_embeddings")
        if isinstance(max_pos, int) and sliding_window > max_pos:
            raise InputError(f"--sliding-window {sliding_window}: above the model's max_position_embeddings "
                             f"{max_pos} (a window that never fills)")
        mt = d["model_type"]
        if mt == "llama":
            # LlamaForCausalLM has no window: the same weights as
            # MistralForCausalLM, whose state-dict names are the same
            keep = set(transformers.MistralConfig().to_dict())
            d = {k: v for k, v in d.items() if k in keep}
            d["model_type"] = "mistral"
            d["architectures"] = ["MistralForCausalLM"]
        elif mt == "qwen2":
            d["use_sliding_window"] = True
            d["max_window_layers"] = 0   # every layer slides
            d.pop("layer_types", None)
        d["sliding_window"] = sliding_window   # gemma2, gemma3_text, mistral: their window field
    # resolved again through the class: every field as the class states it
    cls = transformers.AutoConfig.for_model(d["model_type"]).__class__
    d = cls(**{k: v for k, v in d.items() if k not in ("model_type", "transformers_version")}).to_dict()
    for k in ("quantization_config", "_name_or_path"):
        d.pop(k, None)
    d["dtype"] = {"fp32": "float32", "bf16": "bfloat16"}[dtype_name]
    return d


def _load_mistral(path: str) -> tuple[Any, dict[str, Any], str]:
    """A llama file whose general.name is "mistral", which transformers
    reads as model_type mistral (modeling_gguf_pytorch_utils.py) and then
    cannot map: gguf-py has no mistral architecture to name its tensors
    (transformers 5.23). Its tensors are mapped here through a llama
    skeleton on the meta device (the same state-dict names, and the same
    llama q/k un-permutation), then given to MistralConfig."""
    import torch
    import transformers
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(path, return_tensors=False)["config"]
    fields = {k: v for k, v in parsed.items() if k not in ("model_type", "_model_name_or_path")}
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields))
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=torch.float32)["tensors"]
    config = transformers.MistralConfig(**fields)
    config.dtype = torch.float32
    return config, tensors, "MistralForCausalLM"


# Texts the saved tokenizer must tokenize as the GGUF's does: spaces, a
# newline, accents, CJK, an emoji, digits, a special token's spelling.
PROBE_TEXTS = ("The quick brown fox jumps over the lazy dog.", "  two spaces\nnew line\ttab",
               "café naïve 日本語 🙂", "1234567 3.14", "the cat is in the sea")


def _check_tokenizer(path: str, directory: str, tok: Any) -> None:
    """The tokenizer as saved in directory tokenizes the probe texts as the
    one built from the GGUF file does: transformers 5 loads a directory's
    tokenizer through the model type's class, which imposes its own
    pipeline (Qwen2Tokenizer its byte-level pre-tokenizer), whatever
    tokenizer.json says; a file whose vocabulary does not fit that class
    would otherwise be converted into a directory that tokenizes
    differently. Also drops the loading option local_files_only that
    save_pretrained writes back into tokenizer_config.json."""
    import transformers

    cfg_path = os.path.join(directory, "tokenizer_config.json")

    def edit(**changes: Any) -> None:
        with open(cfg_path, encoding="utf-8") as f:
            c = json.load(f)
        for k, v in changes.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(c, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")

    def same() -> bool:
        back = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
        return all(back(t)["input_ids"] == tok(t)["input_ids"] for t in PROBE_TEXTS)

    edit(local_files_only=None)
    if not same():
        raise InputError(f"{path}: field tokenizer.ggml.model: the tokenizer transformers builds from the "
                         "file tokenizes differently once saved and loaded as the model type's tokenizer")


def convert(path: str, out: str, sliding_window: int | None, dtype_name: str) -> dict[str, Any]:
    """Converts the GGUF file at path into the directory out; returns the
    config written."""
    h = read_header(path)
    arch = check_header(h)
    _check_out(out)
    mpe = h.metadata.get(f"{arch}.context_length")
    if sliding_window is not None and isinstance(mpe, int) and sliding_window > mpe:
        raise InputError(f"--sliding-window {sliding_window}: above the model's context_length {mpe} "
                         f"({arch}.context_length in {path})")

    import torch
    import transformers
    from safetensors.torch import save_file

    print(f"dequantizing {len(h.tensors)} tensors of {path} ({arch}) through transformers", flush=True)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    src_dir, src_name = os.path.split(os.path.abspath(path))
    tmp = f"{os.path.abspath(out).rstrip('/')}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):   # an earlier process with this pid left it
        shutil.rmtree(tmp) if os.path.isdir(tmp) and not os.path.islink(tmp) else os.unlink(tmp)
    os.mkdir(tmp)
    # transformers' progress bars (tqdm) go to stderr, where a refusal must
    # be one line: they are swallowed; convert-gguf says on stdout what it does
    quiet = contextlib.redirect_stderr(io.StringIO())
    try:
        try:
            with quiet:
                if arch == "llama" and h.metadata.get("general.name") == "mistral":
                    config, sd, cls_name = _load_mistral(path)
                else:
                    model = transformers.AutoModelForCausalLM.from_pretrained(
                        src_dir, gguf_file=src_name, dtype=torch.float32, local_files_only=True)
                    config, sd, cls_name = model.config, model.state_dict(), type(model).__name__
                tok = transformers.AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name,
                                                                 local_files_only=True)
        except (ValueError, KeyError, NotImplementedError, RuntimeError) as e:
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise InputError(f"{path}: transformers cannot load it: {type(e).__name__}: {first}") from None
        cfg = _resolve_config(arch, h.metadata, config, cls_name, sliding_window, dtype_name)
        if cfg.get("tie_word_embeddings"):
            sd.pop("lm_head.weight", None)
        # safetensors refuses tensors sharing storage: each its own copy
        tensors = {k: v.detach().to(dtype).contiguous().clone() for k, v in sd.items()}
        save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        del tensors, sd
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        tok.save_pretrained(tmp)
        with contextlib.redirect_stderr(io.StringIO()):
            _check_tokenizer(path, tmp, tok)
        if os.path.isdir(out):
            os.rmdir(out)   # empty (checked): the rename takes its place
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return cfg
