"""Text in, text out: `kvrepro-hf prompts` tokenizes texts with a model
directory's own tokenizer into the prompts file's object form (ids, texts,
tokenizer identity); `capture --text` and `capture --prompts` with that form
write the rows' texts (prompt_text) and the tokenizer attribute into the
report, and nothing new without texts; `show` decodes a report back to text.
Bad input (no tokenizer, an empty text, a bad text file, a bad prompts
object) is exit 2 with one line naming the file and field.

The tokenizer is built here (tokenizers' WordLevel, saved as tokenizer.json
with a tokenizer_config.json) beside a copy of the mistral fixture's model:
no download.

Run: cd python/tests && PYTHONPATH=.. python -m unittest -v test_prompts_text
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

try:
    import h5py
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
except ImportError as e:
    transformers = None
    MISSING = str(e)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "fixtures", "hf", "mistral")   # vocab_size 256
TIMEOUT_S = 300
WORDS = ["this", "is", "a", "nice", "place", ".", "i", "really", "enjoy", "the", "scenery", ",", "list", "of",
         "colors", ":", "red", "blue", "green", "sky", "sea", "é", "café"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    env["OMP_NUM_THREADS"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "kvrepro.cli", *argv], capture_output=True, text=True,
                       env=_env(), timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def write_tokenizer(directory: str) -> None:
    """A word-level tokenizer that adds <s> (id 1) in front, as Gemma's adds
    its BOS: tokenizer.json and tokenizer_config.json."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(directory)


@unittest.skipIf(transformers is None, f"needs transformers, tokenizers, h5py: {globals().get('MISSING')}")
class PromptsTextTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvrepro-text-")
        cls.d = cls.tmp.name
        cls.model = os.path.join(cls.d, "tiny-mistral")
        shutil.copytree(FIXTURE, cls.model, ignore=shutil.ignore_patterns("golden.h5"))
        write_tokenizer(cls.model)
        cls.bare = os.path.join(cls.d, "bare")   # a model without a tokenizer
        shutil.copytree(FIXTURE, cls.bare, ignore=shutil.ignore_patterns("golden.h5"))
        cls.texts = ["This is a nice place. This is a nice place. I really enjoy the scenery,",
                     "A list of colors: red, blue", "café"]

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    def out(self, name: str) -> str:
        return os.path.join(self.d, name)

    def prompts(self, name: str, *args: str) -> dict:
        path = self.out(name)
        rc, so, se = run_cli(["prompts", "--model", self.model, *args, "--out", path])
        self.assertEqual(rc, 0, f"{so}\n{se}")
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    def test_ids_texts_and_identity(self) -> None:
        args = [a for t in self.texts for a in ("--text", t)]
        obj = self.prompts("p.json", *args)
        self.assertEqual(sorted(obj), ["format", "prompts", "texts", "tokenizer", "version"])
        self.assertEqual((obj["format"], obj["version"]), ("kvrepro-prompts", 1))
        tok = transformers.AutoTokenizer.from_pretrained(self.model)
        want = [tok(t, add_special_tokens=True)["input_ids"] for t in self.texts]
        self.assertEqual(obj["prompts"], want)
        self.assertTrue(all(r[0] == 1 for r in obj["prompts"]), "the BOS generate would see")
        self.assertEqual(obj["texts"], self.texts)
        pairs = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
        sha = hashlib.sha256(json.dumps(pairs, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()
        self.assertEqual(obj["tokenizer"], {"name": "tiny-mistral", "vocab_size": len(WORDS) + 3,
                                            "vocab_sha256": sha, "add_special_tokens": True})
        # without the special tokens
        obj = self.prompts("p-nospecial.json", *args, "--no-special-tokens")
        self.assertEqual(obj["prompts"], [r[1:] for r in want])
        self.assertFalse(obj["tokenizer"]["add_special_tokens"])

    def test_text_file(self) -> None:
        path = self.out("texts.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("this is a nice place .\nthe sea\n---\nred , blue\n")
        obj = self.prompts("pf.json", "--text-file", path)
        self.assertEqual(obj["texts"], ["this is a nice place .\nthe sea", "red , blue"])
        self.assertEqual(len(obj["prompts"]), 2)

    def refused(self, argv: list[str], *want: str) -> None:
        before = sorted(os.listdir(self.d))
        rc, so, se = run_cli(argv)
        self.assertEqual(rc, 2, f"exit {rc}\n{so}\n{se}")
        self.assertNotIn("Traceback", se)
        lines = [ln for ln in se.strip().splitlines() if not ln.startswith(("usage:", " "))]
        self.assertEqual(len(lines), 1, se)
        for w in want:
            self.assertIn(w, lines[0])
        self.assertEqual(sorted(os.listdir(self.d)), before, "something was written")

    def test_missing_tokenizer(self) -> None:
        self.refused(["prompts", "--model", self.bare, "--text", "this", "--out", self.out("x.json")],
                     self.bare, "tokenizer")
        self.refused(["capture", "--model", self.bare, "--text", "this", "--max-new-tokens", "2",
                      "--cache", "roll", "--out", self.out("x.h5")], self.bare, "tokenizer")

    def test_bad_texts(self) -> None:
        bad = {
            "empty.txt": (b"", "prompt 0"),
            "blank.txt": (b"this is\n---\n  \n", "prompt 1"),
            "latin1.txt": ("café".encode("latin-1"), "UTF-8"),
            "nul.txt": (b"a\x00b", "NUL"),
        }
        for name, (data, want) in bad.items():
            path = self.out(name)
            with open(path, "wb") as f:
                f.write(data)
            try:
                with self.subTest(file=name):
                    self.refused(["prompts", "--model", self.model, "--text-file", path, "--out",
                                  self.out("x.json")], path, want)
            finally:
                os.unlink(path)
        self.refused(["prompts", "--model", self.model, "--text", "", "--out", self.out("x.json")], "--text 1")
        self.refused(["prompts", "--model", self.model, "--text", "a", "--text", " ", "--out", self.out("x.json")],
                     "--text 2", "empty")
        self.refused(["prompts", "--model", self.model, "--text-file", self.d, "--out", self.out("x.json")],
                     self.d)
        self.refused(["prompts", "--model", self.model, "--out", self.out("x.json")], "--text")
        self.refused(["prompts", "--model", self.model, "--text", "a", "--text-file", self.d,
                      "--out", self.out("x.json")], "--text")

    def test_bad_prompts_object(self) -> None:
        """capture --prompts reads the object form: an unknown key, a wrong
        format or version, texts of another length are refused."""
        good = {"format": "kvrepro-prompts", "version": 1, "prompts": [[1, 4, 5]], "texts": ["this is"]}
        cases = {
            "key.json": ({**good, "extra": 1}, "extra"),
            "format.json": ({**good, "format": "other"}, "format"),
            "version.json": ({**good, "version": 2}, "version"),
            "texts.json": ({**good, "texts": ["a", "b"]}, "texts"),
            "textnum.json": ({**good, "texts": [3]}, "texts"),
            "noprompts.json": ({"format": "kvrepro-prompts", "version": 1}, "prompts"),
            "tokkey.json": ({**good, "tokenizer": {"name": "x", "vocab_size": 3, "vocab_sha256": "0" * 64,
                                                   "bogus": 1}}, "tokenizer.bogus"),
            "toksha.json": ({**good, "tokenizer": {"name": "x", "vocab_size": 3, "vocab_sha256": "xyz"}},
                            "tokenizer.vocab_sha256"),
        }
        for name, (obj, want) in cases.items():
            path = self.out(name)
            with open(path, "w") as f:
                json.dump(obj, f)
            try:
                with self.subTest(file=name):
                    self.refused(["capture", "--model", self.model, "--prompts", path, "--max-new-tokens", "2",
                                  "--cache", "roll", "--out", self.out("x.h5")], path, want)
            finally:
                os.unlink(path)

    def read_runs(self, path: str) -> list[tuple[dict, list[str] | None]]:
        got = []
        with h5py.File(path, "r") as f:
            for name in f["runs"]:
                g = f["runs"][name]
                texts = [t.decode() for t in g["prompt_text"][()]] if "prompt_text" in g else None
                got.append(({k: g.attrs[k] for k in g.attrs}, texts))
        return got

    def test_capture_text_and_show(self) -> None:
        texts = self.texts[:2]
        report = self.out("text.h5")
        args = [a for t in texts for a in ("--text", t)]
        rc, so, se = run_cli(["capture", "--model", self.model, *args, "--max-new-tokens", "3", "--cache",
                              "roll", "--out", report])
        self.assertEqual(rc, 0, f"{so}\n{se}")
        obj = self.prompts("cap.json", *args)
        want_tok = (f"tiny-mistral vocab={obj['tokenizer']['vocab_size']} "
                    f"sha256={obj['tokenizer']['vocab_sha256'][:16]}")
        runs = self.read_runs(report)
        self.assertEqual(len(runs), 1)
        attrs, got_texts = runs[0]
        self.assertEqual(got_texts, texts)
        self.assertEqual(attrs["tokenizer"].decode(), want_tok)
        with h5py.File(report, "r") as f:
            g = f["runs/0000"]
            self.assertEqual(h5py.check_string_dtype(g["prompt_text"].dtype).encoding, "utf-8")
            self.assertEqual(g["prompt_text"].shape, (2,))
            # the ids are the prompts file's, left-padded
            real = g["prompt_real"][()].astype(bool)
            self.assertEqual([list(map(int, g["prompt"][b][real[b]])) for b in range(2)], obj["prompts"])
            scenario = g.attrs["scenario"]
        self.assertEqual(scenario.decode() if isinstance(scenario, bytes) else scenario, "text")
        # capture --prompts with the object form: the same texts and tokenizer
        report2 = self.out("obj.h5")
        rc, so, se = run_cli(["capture", "--model", self.model, "--prompts", self.out("cap.json"),
                              "--max-new-tokens", "3", "--cache", "roll", "--out", report2])
        self.assertEqual(rc, 0, f"{so}\n{se}")
        attrs2, texts2 = self.read_runs(report2)[0]
        self.assertEqual((texts2, attrs2["tokenizer"].decode()), (texts, want_tok))
        # show: the rows' texts and continuations
        rc, so, se = run_cli(["show", report, "--model", self.model])
        self.assertEqual(rc, 0, f"{so}\n{se}")
        self.assertIn(f"row 0 prompt ({len(obj['prompts'][0])} tokens): {texts[0]}", so)
        self.assertIn(f"row 1 prompt ({len(obj['prompts'][1])} tokens): {texts[1]}", so)
        self.assertIn("row 1 continuation: ", so)
        # show refuses a tokenizer that is not the one the report names
        other = os.path.join(self.d, "other-tok")
        shutil.copytree(self.bare, other)
        tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "x": 1}, unk_token="<unk>"))
        transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(other)
        try:
            self.refused(["show", report, "--model", other], report, "tokenizer")
        finally:
            shutil.rmtree(other)

    def test_capture_ids_unchanged(self) -> None:
        """Without texts a run has no prompt_text and no tokenizer attribute
        (an existing report stays as it was)."""
        path = self.out("ids.json")
        with open(path, "w") as f:
            json.dump([[1, 4, 5, 6]], f)
        report = self.out("ids.h5")
        rc, so, se = run_cli(["capture", "--model", self.model, "--prompts", path, "--max-new-tokens", "2",
                              "--cache", "roll", "--out", report])
        self.assertEqual(rc, 0, f"{so}\n{se}")
        attrs, texts = self.read_runs(report)[0]
        self.assertIsNone(texts)
        self.assertNotIn("tokenizer", attrs)


if __name__ == "__main__":
    unittest.main()
