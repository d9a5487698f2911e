#!/usr/bin/env python3
"""vs_llamacpp.py: kvrepro's CPU reference against llama.cpp's CPU backend, the strongest CPU peer,
on the same weights, prompt and threads.

    .venv/bin/python bench/vs_llamacpp.py write-gguf SRC.gguf --dtype f32|bf16 --out OUT.gguf
    .venv/bin/python bench/vs_llamacpp.py bench --model DIR --gguf OUT.gguf [--prompt-len L]
        [--new-tokens N] [--threads T] [--repeats R] [--stat median|best] [--bench-decode PATH]

write-gguf: SRC (any GGUF gguf can dequantize, e.g. the real Gemma 3 270M Q4_K_M of the set-up,
build/real/gemma-3-270m-q4_k_m.gguf) rewritten with every tensor dequantized (gguf.quants, the
dequantizer transformers calls, so the values are the ones `kvrepro-hf convert-gguf` writes) and
stored as F32, or as BF16 for the matrices (rounded to nearest even, gguf.quants.quantize) with the
one-dimensional tensors (norms) kept F32, as llama.cpp's convert_hf_to_gguf.py stores them. The
metadata (architecture, tokenizer, shapes) is copied unchanged but for general.file_type. OUT is
written as OUT.tmp-PID and renamed: absent or complete.

bench: the same (1, L) token ids (bench_decode's SplitMix64 prompt, vs_torch.py's port) through
both engines, alternating (kvrepro, llama.cpp, kvrepro, ...), R rounds; per phase each engine's
tokens/s and the ratio kvrepro/llama.cpp (above 1: kvrepro is faster).
- kvrepro: one `bench_decode --model DIR --batch 1 --threads T --repeats 1 --result-lines` per
  round (DIR: `kvrepro-hf convert-gguf SRC --dtype fp32|bf16`, the same values).
- llama.cpp: llama-cpp-python's Llama(n_threads=T, n_threads_batch=T, n_batch=n_ubatch=L), loaded
  once, one untimed run first. Prefill: eval() of the L ids and the argmax of the last logits;
  decode: N - 1 steps of eval() of one id and its argmax, each timed and summed. reset() between
  rounds drops the cache.
- Batch 1 only: llama-cpp-python's Llama runs one sequence.

llama.cpp is the peer, not the yardstick: it promises no fixed reduction order (its kernels use
fused multiply-add, their own blocking and, for BF16/F16 weights, their own conversion of the
activations), so its tokens may differ in a near-tie; the first difference is printed.

Exit status: 0 done; 1 a run failed; 2 bad input or usage (no model, no bench_decode, no
llama_cpp: the message says how to get each); 3 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import vs_torch
from vs_torch import (EXIT_INPUT, EXIT_INTERNAL, BenchError, Shapes, check_bench_decode,
                      check_model_dir, first_difference, pick, positive, prompt_fnv, repo_root,
                      run_kvrepro, splitmix64_prompt)

LLAMA_CPP_PIN = "llama-cpp-python==0.3.36"
# llama-cpp-python's own runtime dependency that the project's environment lacks (numpy,
# jinja2 and typing-extensions are there).
LLAMA_CPP_EXTRA = "diskcache==5.6.3"


@dataclass(frozen=True)
class LlamaRun:
    prefill_s: float
    decode_s: float
    tokens: list[int]  # (new_tokens,)


def import_gguf() -> ModuleType:
    try:
        import gguf
    except ImportError as e:
        raise BenchError(EXIT_INPUT, f"{sys.executable} cannot import gguf ({e}); run with the "
                         f"project's environment: {repo_root() / '.venv/bin/python'}") from None
    return gguf


def import_llama_cpp() -> ModuleType:
    """llama_cpp, or exit 2 with the command that builds it (from PyPI's source package: a C++
    build of llama.cpp for this CPU, several minutes on 2 cores)."""
    try:
        import llama_cpp
    except ImportError as e:
        py = repo_root() / ".venv/bin/python"
        raise BenchError(EXIT_INPUT, (
            f"{sys.executable} cannot import llama_cpp ({e}). It is a benchmark peer, not part of "
            f"the pinned environment; build it into the project's environment with:\n"
            f"    {py} -m pip install --no-deps {LLAMA_CPP_PIN} {LLAMA_CPP_EXTRA}")) from None
    return llama_cpp


def write_gguf(src: Path, dtype: str, out: Path) -> int:
    gguf = import_gguf()
    import numpy as np
    if not src.is_file():
        raise BenchError(EXIT_INPUT, f"{src}: no such file")
    if out.exists():
        raise BenchError(EXIT_INPUT, f"--out {out}: exists; give a new name")
    try:
        reader = gguf.GGUFReader(str(src))
    except (ValueError, OSError) as e:
        raise BenchError(EXIT_INPUT, f"{src}: not a GGUF gguf can read: {e}") from None
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise BenchError(EXIT_INPUT, f"{src}: no general.architecture")
    arch = arch_field.contents()
    qtype = gguf.GGMLQuantizationType
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), arch=arch)
    try:
        for field in reader.fields.values():
            # GGUFWriter writes the architecture and the GGUF.* header fields itself; the file
            # type is this file's, not the source's.
            if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) \
                    or field.name.startswith("GGUF."):
                continue
            val_type = field.types[0]
            sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_BF16)

        def stored(t: Any) -> Any:  # the tensor as written: F32, or BF16 (as uint8 bytes)
            values = gguf.quants.dequantize(t.data, t.tensor_type)  # numpy shape, float32
            if dtype == "bf16" and values.ndim > 1:
                return gguf.quants.quantize(values, qtype.BF16)
            return values.astype("<f4", copy=False)

        for t in reader.tensors:
            n = int(t.n_elements)
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # ggml's ne, outermost first
            raw = qtype.BF16 if dtype == "bf16" and len(shape) > 1 else qtype.F32
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32 if raw == qtype.F32 else np.uint16),
                                   n * (4 if raw == qtype.F32 else 2), raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(stored(t))
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    print(f"vs_llamacpp: wrote {out} ({arch}, {len(reader.tensors)} tensors, {dtype}) from {src}")
    return 0


class LlamaSide:
    """llama.cpp's model, loaded once."""

    def __init__(self, llama_cpp: ModuleType, path: Path, shapes: Shapes, threads: int) -> None:
        import numpy as np
        self.np = np
        self.llama_cpp = llama_cpp
        try:
            self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=shapes.prompt_len + shapes.new_tokens + 8,
                                       n_batch=shapes.prompt_len, n_ubatch=shapes.prompt_len,
                                       n_threads=threads, n_threads_batch=threads, logits_all=False,
                                       verbose=False)
        except (ValueError, RuntimeError) as e:
            raise BenchError(EXIT_INPUT, f"--gguf {path}: llama.cpp cannot load it: {e}") from None

    def vocab(self) -> int:
        return int(self.llm.n_vocab())

    def argmax_last(self) -> int:
        """The greedy token of the last evaluated position: without logits_all, eval() keeps
        no scores, so its logits are read from the context (llama_get_logits_ith(ctx, -1))."""
        n_vocab = self.vocab()
        ptr = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(self.np.argmax(self.np.ctypeslib.as_array(ptr, shape=(n_vocab,))))

    def run(self, prompt: list[int], new_tokens: int) -> LlamaRun:
        llm = self.llm
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        nxt = self.argmax_last()
        prefill_s = time.perf_counter() - t0
        tokens = [nxt]
        decode_s = 0.0
        for _ in range(new_tokens - 1):
            t0 = time.perf_counter()
            llm.eval([nxt])
            nxt = self.argmax_last()
            decode_s += time.perf_counter() - t0
            tokens.append(nxt)
        return LlamaRun(prefill_s=prefill_s, decode_s=decode_s, tokens=tokens)


def print_table(title: str, rows: list[tuple[str, float | None, float | None]]) -> None:
    print(title)
    print(f"  {'':<10} {'kvrepro':>12} {'llama.cpp':>12} {'kvrepro/llama.cpp':>18}")
    for name, k, t in rows:
        ks = f"{k:12.2f}" if k is not None else f"{'n/a':>12}"
        ts = f"{t:12.2f}" if t is not None else f"{'n/a':>12}"
        rs = f"{k / t:18.3f}" if k is not None and t else f"{'n/a':>18}"
        print(f"  {name:<10} {ks} {ts} {rs}")


def bench(args: argparse.Namespace) -> int:
    shapes = Shapes(batch=1, prompt_len=args.prompt_len, new_tokens=args.new_tokens)
    model, gguf_path = Path(args.model), Path(args.gguf)
    bench_decode = Path(args.bench_decode) if args.bench_decode else repo_root() / "build" / "bench_decode"
    check_model_dir(model)
    check_bench_decode(bench_decode)
    if not gguf_path.is_file():
        raise BenchError(EXIT_INPUT, f"--gguf {gguf_path}: no such file (write it with "
                         "`vs_llamacpp.py write-gguf SRC.gguf --dtype f32 --out FILE`)")
    llama_cpp = import_llama_cpp()

    kv_runs = [run_kvrepro(bench_decode, model, shapes, args.threads, args.prompt_seed)]
    prompt = splitmix64_prompt(1, shapes.prompt_len, args.prompt_seed, kv_runs[0].vocab)
    if prompt_fnv(prompt) != kv_runs[0].prompt_fnv:
        raise BenchError(EXIT_INTERNAL, "the prompt built here is not bench_decode's: the PRNG port "
                         "in vs_torch.py no longer matches model/prng.c")
    side = LlamaSide(llama_cpp, gguf_path, shapes, args.threads)
    if side.vocab() != kv_runs[0].vocab:
        raise BenchError(EXIT_INPUT, f"vocab: kvrepro {kv_runs[0].vocab} ({model}), llama.cpp "
                         f"{side.vocab()} ({gguf_path}): not the same model")
    side.run(prompt[0], shapes.new_tokens)  # warm-up, not timed
    ll_runs = [side.run(prompt[0], shapes.new_tokens)]

    print(f"vs_llamacpp: kvrepro {model}, llama.cpp {gguf_path}; batch 1, prompt {shapes.prompt_len} "
          f"tokens (prompt seed {args.prompt_seed}), new tokens {shapes.new_tokens} "
          f"({shapes.decode_steps} timed decode steps), threads {args.threads}")
    print(f"llama-cpp-python {llama_cpp.__version__}; kvrepro {bench_decode}, OMP_NUM_THREADS="
          f"{args.threads}, prefill matmul path {kv_runs[0].matmul_path}")

    def show_round(i: int) -> None:
        k, t = kv_runs[i], ll_runs[i]
        print(f"round {i + 1}/{args.repeats}: kvrepro prefill {k.prefill_s * 1e3:.2f} ms, decode "
              f"{k.decode_s * 1e3:.2f} ms; llama.cpp prefill {t.prefill_s * 1e3:.2f} ms, decode "
              f"{t.decode_s * 1e3:.2f} ms", flush=True)

    show_round(0)
    for i in range(1, args.repeats):
        kv_runs.append(run_kvrepro(bench_decode, model, shapes, args.threads, args.prompt_seed))
        ll_runs.append(side.run(prompt[0], shapes.new_tokens))
        show_round(i)

    steps = shapes.decode_steps
    kv_prefill = pick([shapes.prompt_len / r.prefill_s for r in kv_runs], args.stat)
    ll_prefill = pick([shapes.prompt_len / r.prefill_s for r in ll_runs], args.stat)
    kv_dec = [steps / r.decode_s for r in kv_runs if r.decode_s > 0]
    ll_dec = [steps / r.decode_s for r in ll_runs if r.decode_s > 0]
    stat = "median" if args.stat == "median" else "best"
    print(f"\n{stat} of {args.repeats} rounds, alternating kvrepro and llama.cpp (llama.cpp warmed up "
          "once before round 1; bench_decode warms up in every run)")
    print_table(f"prefill: 1 x {shapes.prompt_len} tokens, one forward", [("tokens/s", kv_prefill, ll_prefill)])
    print_table(f"decode: {steps} steps of 1 token",
                [("tokens/s", pick(kv_dec, args.stat) if kv_dec else None,
                  pick(ll_dec, args.stat) if ll_dec else None)])
    diff = first_difference(kv_runs[0].tokens, [ll_runs[-1].tokens])
    if diff is None:
        print(f"\ngreedy tokens: identical (1 x {shapes.new_tokens})")
    else:
        _, s = diff
        print(f"\ngreedy tokens: differ first at step {s} (kvrepro {kv_runs[0].tokens[0][s]}, llama.cpp "
              f"{ll_runs[-1].tokens[s]}): a near-tie under llama.cpp's own rounding (see the top of this "
              "file), or a model difference")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vs_llamacpp.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write-gguf", help="a GGUF's weights dequantized, stored as F32 or BF16")
    w.add_argument("src", help="the source .gguf")
    w.add_argument("--dtype", choices=("f32", "bf16"), required=True)
    w.add_argument("--out", required=True, help="the .gguf to write (a new name)")
    b = sub.add_parser("bench", help="kvrepro against llama.cpp, alternating rounds")
    b.add_argument("--model", required=True, help="kvrepro's checkpoint directory (convert-gguf of the source)")
    b.add_argument("--gguf", required=True, help="llama.cpp's checkpoint (write-gguf of the source)")
    b.add_argument("--prompt-len", type=positive, default=512, help="prompt tokens, L (default 512)")
    b.add_argument("--new-tokens", type=positive, default=32,
                   help="tokens per run, N >= 2: N - 1 timed decode steps (default 32)")
    b.add_argument("--threads", type=positive, default=len(os.sched_getaffinity(0)),
                   help="threads of both engines (default: the CPUs this process may run on)")
    b.add_argument("--repeats", type=positive, default=5, help="alternating rounds, R (default 5)")
    b.add_argument("--stat", choices=("median", "best"), default="median")
    b.add_argument("--prompt-seed", type=vs_torch.seed, default=vs_torch.DEFAULT_PROMPT_SEED,
                   help="prompt token ids' seed (bench_decode's by default)")
    b.add_argument("--bench-decode", default="", help="bench_decode binary (default build/bench_decode)")
    args = ap.parse_args(argv)
    if args.cmd == "bench" and args.new_tokens < 2:
        ap.error("--new-tokens: expected N >= 2 (one token from the prefill, N - 1 decode steps)")
    try:
        if args.cmd == "write-gguf":
            return write_gguf(Path(args.src), args.dtype, Path(args.out))
        return bench(args)
    except BenchError as e:
        print(f"vs_llamacpp: {e}", file=sys.stderr)
        return e.status


if __name__ == "__main__":
    sys.exit(main())
