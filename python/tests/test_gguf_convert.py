"""kvrepro-hf convert-gguf: a GGUF checkpoint (what llama.cpp users have)
turned into the F32 Hugging Face directory the gate reads.

For each architecture the converter supports, a tiny random model is built
with transformers' own classes and written to a GGUF file here the way
llama.cpp's convert_hf_to_gguf.py writes one: its tensor names
(gguf.get_tensor_name_map), LlamaModel.permute of the q/k rows for llama,
Gemma's RMSNorm weights stored as w + 1, the metadata keys transformers
reads, a sentencepiece ("llama") vocabulary. convert-gguf must give back
every tensor bit for bit, the config fields and a tokenizer that loads.
Then bad files: each is exit 2, one line naming the file and the field,
nothing written.

Run: cd python/tests && PYTHONPATH=.. python -m unittest -v test_gguf_convert
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from typing import Any

try:
    import gguf
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:   # the project's .venv has them all (python/requirements.txt)
    gguf = None
    MISSING = str(e)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIMEOUT_S = 300

# The tiny shapes: vocab 128, hidden 32, 2 layers, 4 heads of 8, 2 KV heads.
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN, CTX = 128, 32, 2, 4, 2, 8, 64, 256


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_cli_here(argv: list[str]) -> tuple[int, str, str]:
    """kvrepro-hf in this process: the round trips convert a dozen files, and
    a fresh interpreter would import torch and transformers for each (the
    refusals, whose exit codes and lines matter, run as a real process)."""
    from kvrepro import cli
    out, err = io.StringIO(), io.StringIO()
    os.environ["HF_HUB_OFFLINE"] = "1"
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse usage errors
            rc = int(e.code) if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "kvrepro.cli", *argv], capture_output=True, text=True,
                       env=_env(), timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def tiny_tokens() -> list[str]:
    """A sentencepiece vocabulary of VOCAB pieces: <unk> <s> </s>, the
    letters with and without the word-start mark, then a few words."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    toks = ["<unk>", "<s>", "</s>", "\u2581"] + list(letters) + ["\u2581" + c for c in letters]
    words = ["the", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "th", "es", "or", "te", "of", "ed",
             "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le", "ve", "co",
             "me", "de", "hi", "ri", "ro", "ic", "ne", "ea", "ra", "ce", "li", "ch", "ll", "be", "ma", "si",
             "om", "ur", "ca", "el", "ta", "la", "ns", "di", "fo", "ho", "pe", "ec", "pr", "no", "ct", "us",
             "ac", "ot", "il", "tr", "cat", "sea", "sky", "sun", "red", "car"]
    toks += ["\u2581" + w for w in words]
    assert len(set(toks)) >= VOCAB, len(set(toks))
    return toks[:VOCAB]


def tiny_bpe() -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary of VOCAB tokens and its merges, as a
    Qwen2 GGUF has (tokenizer.ggml.model "gpt2"): three control tokens, the
    letters, "\u0120" (GPT-2's spelling of a space) and words built up one
    merge at a time."""
    sp = "\u0120"
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", sp, ".", ","] + list("abcdefghijklmnopqrstuvwxyz")
    merges: list[str] = []
    for w in ("the", "cat", "is", "in", "sea", "sky", "red", "blue", "dog", "fox", "over", "lazy", "quick",
              "brown", "jumps", "new", "line", "two", "spaces", "tab", "and", "of", "to", "it", "on"):
        prev = sp
        for c in w:
            nxt = prev + c
            if nxt not in toks:
                if len(toks) == VOCAB:
                    return toks, merges
                toks.append(nxt)
                merges.append(f"{prev} {c}")
            prev = nxt
    while len(toks) < VOCAB:   # unreachable with the words above; keeps the size exact
        toks.append(f"<|extra_{len(toks)}|>")
    return toks, merges


def hf_model(arch: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """A tiny random model of the family arch names (a GGUF
    general.architecture, or "mistral": llama weights whose general.name
    is "mistral", which is how llama.cpp writes Mistral)."""
    torch.manual_seed(1234)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=CTX,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, head_dim=HEAD_DIM, rope_theta=5000.0, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**common, head_dim=HEAD_DIM, rope_theta=20000.0, sliding_window=4096,
                                         tie_word_embeddings=False)
        model = transformers.MistralForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common, rope_theta=30000.0, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "gemma2":
        cfg = transformers.Gemma2Config(**common, head_dim=HEAD_DIM, rope_theta=10000.0, sliding_window=16,
                                        query_pre_attn_scalar=HEAD_DIM, attn_logit_softcapping=40.0,
                                        final_logit_softcapping=20.0, tie_word_embeddings=True)
        model = transformers.Gemma2ForCausalLM(cfg)
    elif arch == "gemma3":
        cfg = transformers.Gemma3TextConfig(**common, head_dim=HEAD_DIM, rope_theta=1_000_000.0,
                                            sliding_window=16, query_pre_attn_scalar=HEAD_DIM,
                                            tie_word_embeddings=True)
        model = transformers.Gemma3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    model = model.float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # multiples of 1/1024 in (-0.5, 0.5): llama.cpp stores Gemma's
                # norms as w + 1 and transformers subtracts 1 again; with
                # these values both float32 steps are exact, so the round
                # trip can be asserted bit for bit
                p.copy_(torch.randint(-511, 512, p.shape).float() / 1024)
            else:
                p.copy_(torch.randn(p.shape) * 0.1)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return cfg, sd


def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: the rows of
    each head reordered from HF's rotate-half pairs (i, i + d/2) to GGML's
    interleaved pairs (2i, 2i + 1)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: str, arch: str, *, omit_arch: bool = False, gguf_arch: str | None = None,
               raw_override: dict[str, tuple[np.ndarray, Any]] | None = None,
               rope_scaling: str | None = None, spm: bool | None = None, split_count: int | None = None) -> tuple[Any, dict[str, torch.Tensor]]:
    """Writes the tiny model of arch to path as llama.cpp would, F32
    tensors. Returns the HF config and state dict it came from."""
    cfg, sd = hf_model(arch)
    file_arch = gguf_arch or ("llama" if arch == "mistral" else arch)
    # tensor names from the family's own map, whatever general.architecture says
    gguf_model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}["llama" if arch == "mistral" else arch]
    w = gguf.GGUFWriter(path, file_arch)
    if omit_arch:
        # GGUFWriter writes general.architecture itself: drop it again
        for shard in w.kv_data:
            shard.pop("general.architecture", None)
    # transformers reads "mistral" from a llama file whose general.name is that
    w.add_name("mistral" if arch == "mistral" else f"tiny-{arch}")
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if "rope_theta" in cfg.rope_parameters
                               else cfg.rope_parameters["full_attention"]["rope_theta"]))
    if arch in ("llama", "mistral"):
        w.add_vocab_size(VOCAB)
        w.add_rope_dimension_count(HEAD_DIM)
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
    if arch in ("gemma2", "gemma3"):
        w.add_key_length(HEAD_DIM)
        w.add_value_length(HEAD_DIM)
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if rope_scaling:   # as convert_hf_to_gguf.py writes Gemma 3 4B's
        w.add_rope_scaling_type(gguf.RopeScalingType(rope_scaling))
        w.add_rope_scaling_factor(8.0)
    if split_count:   # what llama-gguf-split writes in each part
        w.add_uint16("split.count", split_count)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if (arch == "qwen2") if spm is None else not spm:   # as convert_hf_to_gguf.py writes Qwen2's byte-level BPE
        toks, merges = tiny_bpe()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(toks)
        w.add_token_types([gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(toks) - 3))
        w.add_token_merges(merges)
        w.add_eos_token_id(2)
        w.add_pad_token_id(0)
        w.add_add_bos_token(False)
    else:   # sentencepiece ("llama"), as Llama 2, Mistral and Gemma files have
        toks = tiny_tokens()
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(len(toks) - 3)])
        w.add_token_types([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
                          + [gguf.TokenType.NORMAL] * (len(toks) - 3))
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
    name_map = gguf.get_tensor_name_map(gguf_model_arch, LAYERS)
    for hf_name, t in sd.items():
        base, suffix = hf_name.rsplit(".", 1)
        g = name_map.get_name(base)
        assert g is not None, f"{arch}: no GGUF name for {hf_name}"
        data = t.numpy().astype(np.float32)
        if arch in ("llama", "mistral") and base.endswith("q_proj"):
            data = llama_permute(data, HEADS, HEADS)
        elif arch in ("llama", "mistral") and base.endswith("k_proj"):
            data = llama_permute(data, HEADS, KV_HEADS)
        if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
            data = data + 1   # convert_hf_to_gguf.py Gemma2Model/Gemma3Model
        name = f"{g}.{suffix}"
        if raw_override and name in raw_override:
            raw, qtype = raw_override[name]
            w.add_tensor(name, raw, raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return cfg, sd


@unittest.skipIf(gguf is None, f"needs gguf, torch, transformers, safetensors: {globals().get('MISSING')}")
class ConvertTest(unittest.TestCase):
    """Each supported architecture round-trips through a GGUF file."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvrepro-gguf-")
        cls.d = cls.tmp.name

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def convert(self, arch: str, *extra: str, **kw: Any) -> tuple[Any, dict[str, torch.Tensor], str]:
        # each conversion its own names (test_gate_accepts_it converts gemma3 too)
        tag = "-".join([self._testMethodName, arch, *[e.strip("-") for e in extra]])
        src = os.path.join(self.d, f"{tag}.gguf")
        cfg, sd = write_gguf(src, arch, **kw)
        out = os.path.join(self.d, f"{tag}-hf")
        self.src = src
        rc, so, se = run_cli_here(["convert-gguf", src, "--out", out, *extra])
        self.assertEqual(rc, 0, f"{arch}: exit {rc}\n{so}\n{se}")
        return cfg, sd, out

    def check_round_trip(self, arch: str, want_type: str) -> tuple[dict[str, Any], str]:
        cfg, sd, out = self.convert(arch)
        self.assertTrue(os.path.isfile(os.path.join(out, "model.safetensors")), os.listdir(out))
        got = load_file(os.path.join(out, "model.safetensors"))
        self.assertEqual(sorted(got), sorted(sd), f"{arch}: tensor names")
        for name, t in sd.items():
            self.assertEqual(got[name].dtype, torch.float32, name)
            self.assertTrue(torch.equal(got[name], t), f"{arch}: {name} differs: max |d| "
                            f"{(got[name] - t).abs().max().item() if got[name].shape == t.shape else got[name].shape}")
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        self.assertEqual(c["model_type"], want_type)
        self.assertNotIn("quantization_config", c)
        self.assertNotIn("_name_or_path", c)
        self.assertEqual(c["dtype"], "float32")
        self.assertEqual(c["rms_norm_eps"], 1e-5)   # the float32 in the file, written as the original decimal
        ref = cfg.to_dict()
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "intermediate_size", "rms_norm_eps", "tie_word_embeddings", "sliding_window",
                    "rope_parameters", "max_position_embeddings", "query_pre_attn_scalar",
                    "attn_logit_softcapping", "final_logit_softcapping", "layer_types"):
            if key in ref:
                self.assertIn(key, c, f"{arch}: config.json lacks {key}")
                want, have = ref[key], c[key]
                if isinstance(want, float):
                    self.assertAlmostEqual(have, want, delta=abs(want) * 1e-6, msg=f"{arch}: {key}")
                else:
                    self.assertEqual(have, want, f"{arch}: {key}")
        # loads as a transformers checkpoint, and its tokenizer too
        m = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        self.assertEqual(type(m).__name__, type(transformers.AutoModelForCausalLM.from_config(cfg)).__name__)
        tok = transformers.AutoTokenizer.from_pretrained(out)
        src_dir, src_name = os.path.split(self.src)
        from_gguf = transformers.AutoTokenizer.from_pretrained(src_dir, gguf_file=src_name)
        self.assertEqual(tok.get_vocab(), from_gguf.get_vocab(), f"{arch}: the saved tokenizer's vocabulary")
        if arch == "qwen2":
            self.assertEqual(tok.get_vocab()["\u0120the"], tiny_bpe()[0].index("\u0120the"))
        else:
            self.assertEqual(tok.get_vocab()["\u2581the"], tiny_tokens().index("\u2581the"))
        ids = tok("the cat is in the sea")["input_ids"]
        if arch != "qwen2":   # Qwen2 has no BOS
            self.assertEqual(ids[0], 1, f"{arch}: BOS first: {ids}")
        self.assertTrue(all(0 <= i < VOCAB for i in ids), ids)
        self.assertIn("the", tok.decode(ids, skip_special_tokens=True))
        self.assertEqual(ids, from_gguf("the cat is in the sea")["input_ids"])
        # the converted model computes what the original does
        orig = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
        orig.load_state_dict(sd, strict=False)
        if cfg.tie_word_embeddings:
            orig.tie_weights()
        x = torch.tensor([ids])
        with torch.no_grad():
            self.assertTrue(torch.equal(orig(x).logits, m.eval()(x).logits), f"{arch}: logits differ")
        return c, out

    def test_llama(self) -> None:
        # the q/k rows went through LlamaModel.permute: bit-equal back means it was undone
        self.check_round_trip("llama", "llama")

    def test_mistral(self) -> None:
        self.check_round_trip("mistral", "mistral")

    def test_qwen2(self) -> None:
        self.check_round_trip("qwen2", "qwen2")

    def test_gemma2(self) -> None:
        self.check_round_trip("gemma2", "gemma2")

    def test_gemma3(self) -> None:
        c, _ = self.check_round_trip("gemma3", "gemma3_text")
        self.assertEqual(c["layer_types"].count("sliding_attention"), LAYERS, c["layer_types"])

    def test_permutation_is_needed(self) -> None:
        """The planted-bug check of the llama case: the permuted rows are
        not the original ones (a converter that forgot to undo the
        permutation would fail test_llama)."""
        _, sd = hf_model("llama")
        q = sd["model.layers.0.self_attn.q_proj.weight"].numpy()
        self.assertFalse(np.array_equal(llama_permute(q, HEADS, HEADS), q))

    def test_sliding_window_llama_becomes_mistral(self) -> None:
        cfg, sd, out = self.convert("llama", "--sliding-window", "12")
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        self.assertEqual(c["model_type"], "mistral")
        self.assertEqual(c["architectures"], ["MistralForCausalLM"])
        self.assertEqual(c["sliding_window"], 12)
        self.assertEqual(c["head_dim"], HEAD_DIM)
        self.assertEqual(c["rope_parameters"]["rope_theta"], 5000.0)
        got = load_file(os.path.join(out, "model.safetensors"))
        self.assertTrue(all(torch.equal(got[k], v) for k, v in sd.items()))
        m = transformers.AutoModelForCausalLM.from_pretrained(out)
        self.assertEqual(type(m).__name__, "MistralForCausalLM")
        self.assertEqual(m.config.sliding_window, 12)

    def test_sliding_window_qwen2_and_gemma(self) -> None:
        _, _, out = self.convert("qwen2", "--sliding-window", "8")
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        self.assertEqual((c["use_sliding_window"], c["sliding_window"]), (True, 8))
        self.assertEqual(c["layer_types"], ["sliding_attention"] * LAYERS)
        _, _, out = self.convert("gemma2", "--sliding-window", "8")
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["sliding_window"], 8)

    def test_bf16(self) -> None:
        _, sd, out = self.convert("qwen2", "--dtype", "bf16")
        got = load_file(os.path.join(out, "model.safetensors"))
        for k, v in sd.items():
            self.assertEqual(got[k].dtype, torch.bfloat16, k)
            self.assertTrue(torch.equal(got[k], v.to(torch.bfloat16)), k)
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["dtype"], "bfloat16")

    def test_gate_accepts_it(self) -> None:
        """The C gate reads the converted directory (when the binary is
        here: ctest gives KVREPRO_BIN)."""
        binary = os.environ.get("KVREPRO_BIN")
        if not binary or not os.access(binary, os.X_OK):
            self.skipTest("no KVREPRO_BIN (run through ctest)")
        for arch, extra in (("gemma3", ()), ("llama", ("--sliding-window", "4"))):
            with self.subTest(arch=arch):
                _, _, out = self.convert(arch, *extra)
                prompts = os.path.join(self.d, f"p-{arch}.json")
                with open(prompts, "w") as f:
                    json.dump([[1, 40, 41, 42, 43, 44, 45]], f)
                p = subprocess.run([binary, "gate", "--model", out, "--prompts", prompts, "--max-new-tokens", "2",
                                    "--variants", "ring", "--modes", "eager", "--repeats", "1", "--no-calibrate",
                                    "--backends", "cpu", "--report", os.path.join(self.d, f"g-{arch}.h5")],
                                   capture_output=True, text=True, timeout=TIMEOUT_S)
                self.assertEqual(p.returncode, 0, f"{p.stdout}\n{p.stderr}")


@unittest.skipIf(gguf is None, f"needs gguf, torch, transformers, safetensors: {globals().get('MISSING')}")
class BadFileTest(unittest.TestCase):
    """Bad GGUF files: exit 2, one line naming the file and the field, no
    traceback, nothing written."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvrepro-gguf-bad-")
        cls.d = cls.tmp.name
        cls.good = os.path.join(cls.d, "good.gguf")
        write_gguf(cls.good, "llama")
        with open(cls.good, "rb") as f:
            cls.good_bytes = f.read()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def file(self, name: str, data: bytes) -> str:
        path = os.path.join(self.d, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def refused(self, src: str, *want: str, extra: tuple[str, ...] = ()) -> str:
        out = os.path.join(self.d, "out")
        before = sorted(os.listdir(self.d))
        try:
            rc, so, se = run_cli(["convert-gguf", src, "--out", out, *extra])
        finally:   # what a wrongly accepted case wrote: the next case is judged on its own
            if os.path.isdir(out):
                shutil.rmtree(out)
                before.append("out (written)")
        self.assertEqual(rc, 2, f"exit {rc}\n{so}\n{se}")
        self.assertNotIn("Traceback", se)
        # one line: ours, or argparse's after its usage lines
        lines = [ln for ln in se.strip().splitlines() if not ln.startswith(("usage:", " "))]
        self.assertEqual(len(lines), 1, se)
        for w in want:
            self.assertIn(w, lines[0])
        self.assertEqual(sorted(os.listdir(self.d)), before, "something was written")
        return lines[0]

    def test_truncated(self) -> None:
        for cut in (len(self.good_bytes) - 100, len(self.good_bytes) // 2, 200, 10):
            with self.subTest(cut=cut):
                src = self.file(f"trunc{cut}.gguf", self.good_bytes[:cut])
                self.refused(src, src, "truncated")

    def test_empty(self) -> None:
        src = self.file("empty.gguf", b"")
        self.refused(src, src, "magic")

    def test_wrong_magic(self) -> None:
        src = self.file("magic.gguf", b"GGML" + self.good_bytes[4:])
        self.refused(src, src, "magic")

    def test_bad_version(self) -> None:
        src = self.file("version.gguf", self.good_bytes[:4] + struct.pack("<I", 99) + self.good_bytes[8:])
        self.refused(src, src, "version")

    def test_unsupported_tensor_type(self) -> None:
        # a tensor stored as Q8_1, a type gguf's dequantizer lacks
        # (it is llama.cpp's intermediate for dot products, never a file's)
        q81 = gguf.GGMLQuantizationType.Q8_1
        block, type_size = gguf.GGML_QUANT_SIZES[q81]
        raw = np.zeros((HIDDEN, HIDDEN // block * type_size), np.uint8)   # the bytes of (HIDDEN, HIDDEN) values
        src = os.path.join(self.d, "q81.gguf")
        write_gguf(src, "llama", raw_override={"blk.0.attn_q.weight": (raw, q81)})
        self.refused(src, src, "blk.0.attn_q.weight", "Q8_1")

    def test_unknown_type_id(self) -> None:
        # the type field of the first tensor's header patched to 250, no type at all
        data = bytearray(self.good_bytes)
        name = b"token_embd.weight"
        i = data.index(name) + len(name)
        n_dims = struct.unpack_from("<I", data, i)[0]
        struct.pack_into("<I", data, i + 4 + 8 * n_dims, 250)
        src = self.file("typeid.gguf", bytes(data))
        self.refused(src, src, "token_embd.weight", "type")

    def test_architecture_without_family(self) -> None:
        src = os.path.join(self.d, "bloom.gguf")
        write_gguf(src, "llama", gguf_arch="bloom")
        line = self.refused(src, src, "general.architecture", "bloom")
        for arch in ("llama", "gemma2", "gemma3", "qwen2"):
            self.assertIn(arch, line)

    def test_gpt_oss(self) -> None:
        src = os.path.join(self.d, "gptoss.gguf")
        write_gguf(src, "llama", gguf_arch="gpt-oss")
        self.refused(src, src, "general.architecture", "gpt-oss", "gate_up_proj")

    def test_split_file(self) -> None:
        src = os.path.join(self.d, "part.gguf")
        write_gguf(src, "llama", split_count=3)
        self.refused(src, src, "split.count")

    def test_rope_scaling(self) -> None:
        src = os.path.join(self.d, "scaled.gguf")
        write_gguf(src, "llama", rope_scaling="linear")
        self.refused(src, src, "llama.rope.scaling.type", "linear")

    def test_tokenizer_that_does_not_survive(self) -> None:
        """A qwen2 file with a sentencepiece vocabulary: the directory's
        tokenizer would be Qwen2Tokenizer, whose byte-level pipeline splits
        these tokens differently; refused rather than written."""
        src = os.path.join(self.d, "qwen2-spm.gguf")
        write_gguf(src, "qwen2", spm=True)
        self.refused(src, src, "tokenizer.ggml.model")

    def test_missing_architecture(self) -> None:
        src = os.path.join(self.d, "noarch.gguf")
        write_gguf(src, "llama", omit_arch=True)
        self.refused(src, src, "general.architecture", "missing")

    def test_missing_shape_key(self) -> None:
        data = self.good_bytes.replace(b"llama.block_count", b"llama.block_c0unt")
        src = self.file("noblocks.gguf", data)
        self.refused(src, src, "llama.block_count")

    def test_sliding_window_bounds(self) -> None:
        for n in ("0", "-1", str(CTX + 1), "x"):
            with self.subTest(n=n):
                self.refused(self.good, "--sliding-window", extra=("--sliding-window", n))

    def test_out_refused(self) -> None:
        full = os.path.join(self.d, "full")
        os.mkdir(full)
        with open(os.path.join(full, "keep"), "w") as f:
            f.write("x")
        try:
            rc, _, se = run_cli(["convert-gguf", self.good, "--out", full])
            self.assertEqual(rc, 2, se)
            self.assertIn(full, se)
            self.assertEqual(os.listdir(full), ["keep"])
            rc, _, se = run_cli(["convert-gguf", self.good, "--out", self.good])
            self.assertEqual(rc, 2, se)
            self.assertIn("--out", se)
        finally:
            os.unlink(os.path.join(full, "keep"))
            os.rmdir(full)

    def test_supported_types_dequantize(self) -> None:
        """Every type the converter lets through is one gguf's dequantizer
        (what transformers calls) handles: one block of zeros each."""
        from kvrepro.gguf_convert import SUPPORTED_TYPES

        for name in SUPPORTED_TYPES:
            with self.subTest(type=name):
                t = gguf.GGMLQuantizationType[name]
                block, type_size = gguf.GGML_QUANT_SIZES[t]
                if name in ("F32", "F16", "BF16"):
                    raw = np.zeros(type_size, np.uint8)
                else:
                    raw = np.zeros((1, type_size), np.uint8)
                got = gguf.quants.dequantize(raw, t)
                self.assertEqual(np.asarray(got).size, block)

    def test_not_a_file(self) -> None:
        self.refused(self.d, self.d)
        missing = os.path.join(self.d, "nope.gguf")
        self.refused(missing, missing)


if __name__ == "__main__":
    unittest.main()
