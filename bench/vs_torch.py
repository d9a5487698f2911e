#!/usr/bin/env python3
"""vs_torch.py: kvrepro's CPU reference against transformers eager fp32 on the CPU, the peer to beat.

    .venv/bin/python bench/vs_torch.py --model DIR [--prompt-len L] [--batch B] [--new-tokens N]
        [--threads T] [--repeats R] [--stat median|best] [--prompt-seed S] [--bench-decode PATH]

Runs the same checkpoint and shapes through both engines, back to back and alternating (kvrepro,
torch, kvrepro, torch, ... R rounds), and prints per phase each engine's figure and the ratio
kvrepro/torch (above 1: kvrepro is faster). Not a test: the figures depend on the machine and on
whatever else runs on it.

- kvrepro: one `bench_decode --model DIR --threads T --repeats 1 --result-lines` per round, with
  OMP_NUM_THREADS=T, read from its RESULT lines. bench_decode warms up before timing in every
  run; its copy test is shrunk (--copy-mib) because this script does not use it.
- torch: AutoModelForCausalLM.from_pretrained(DIR, dtype=float32, attn_implementation="eager"),
  eval(), torch.inference_mode(), torch.set_num_threads(T); loaded once, warmed up with one
  untimed run before round 1.
- Prompt: the same (B, L) token ids on both sides: bench_decode's SplitMix64 stream
  (model/prng.h) ported here and checked against the FNV-1a hash bench_decode prints.
- Prefill: kvrepro times kv_decode_greedy with one new token (state setup, the prompt's forward,
  the last token's lm_head, the argmax); torch times model(ids, use_cache=True,
  logits_to_keep=1) and the argmax, the model building its default cache (DynamicCache with the
  sliding layers the config asks for).
- Decode: N - 1 greedy steps of one token a row. kvrepro: its full run minus its prefill run (as
  bench_decode reports it); torch: each step's forward with the cache and the argmax, timed one
  by one and summed.
- GFLOP/s: bench_decode's count for both engines (2 flops per matmul weight a token goes
  through, plus the lm_head once per sequence in the prefill and once per row per decode step;
  attention, norms and RoPE not counted), taken from its RESULT lines, so the GFLOP/s ratio is
  the tokens/s ratio and the two engines are counted alike.
- The statistic (--stat): the median of the R rounds (default) or the best, per engine and
  figure; the greedy tokens of the two engines are compared and the result printed (a
  difference is reported, not fatal: a near-tie may flip in fp32).

Exit status: 0 done; 1 a run failed; 2 bad input or usage (no model directory, no bench_decode,
a Python without torch/transformers: the message says how to make each); 3 internal error (the
two engines' prompts differ, bench_decode's output unreadable).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import struct
import subprocess
import sys
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_INTERNAL = 3

# bench_decode's default prompt seed ("bench"); passed to it explicitly so both sides agree.
DEFAULT_PROMPT_SEED = 0x62656E6368
# bench_decode's copy test is not used here; the smallest buffer it takes keeps each run short.
BENCH_COPY_MIB = 2
MASK64 = (1 << 64) - 1


class BenchError(Exception):
    """A failure with its exit status; the message says what and where."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Shapes:
    batch: int
    prompt_len: int
    new_tokens: int  # tokens per run: 1 from the prefill, new_tokens - 1 decode steps

    @property
    def decode_steps(self) -> int:
        return self.new_tokens - 1


@dataclass(frozen=True)
class KvreproRun:
    """One bench_decode run's RESULT lines."""

    prompt_fnv: int
    vocab: int
    prefill_s: float
    prefill_flops: float
    decode_s: float  # <= 0: not measurable (full run no slower than the prefill run)
    decode_flops_per_step: float
    matmul_weights_per_token: float
    lm_head_weights: float
    matmul_path: str  # bench_decode's rows > 1 matmul (gemm.h), the prefill's
    tokens: list[list[int]]  # (batch, new_tokens)


@dataclass(frozen=True)
class TorchRun:
    prefill_s: float
    decode_s: float
    tokens: list[list[int]]  # (batch, new_tokens)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def splitmix64_prompt(batch: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    """bench_decode's prompt: (batch, length) ids from kv_prng_seed(seed), each
    kv_prng_below(vocab) (model/prng.c: SplitMix64, multiply-shift of the top 32 bits)."""
    state = seed & MASK64
    rows: list[list[int]] = []
    for _ in range(batch):
        row = []
        for _ in range(length):
            state = (state + 0x9E3779B97F4A7C15) & MASK64
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
            z ^= z >> 31
            row.append(((z >> 32) * vocab) >> 32)
        rows.append(row)
    return rows


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & MASK64
    return h


def prompt_fnv(rows: list[list[int]]) -> int:
    """FNV-1a 64 of the ids as bench_decode hashes them: int32, row-major, little-endian."""
    flat = [t for row in rows for t in row]
    return fnv1a64(struct.pack(f"<{len(flat)}i", *flat))


def check_model_dir(path: Path) -> None:
    if not path.is_dir():
        raise BenchError(EXIT_INPUT, f"--model {path}: not a directory (write a fixture with "
                         "`build/kvrepro fixture --family mistral --size medium --out DIR`)")
    if not (path / "config.json").is_file():
        raise BenchError(EXIT_INPUT, f"--model {path}: {path / 'config.json'} missing")
    if not (path / "model.safetensors").is_file() and not (path / "model.safetensors.index.json").is_file():
        raise BenchError(EXIT_INPUT, f"--model {path}: neither model.safetensors nor "
                         "model.safetensors.index.json")


def check_bench_decode(path: Path) -> None:
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BenchError(EXIT_INPUT, f"{path}: missing or not executable; build it from "
                         f"{repo_root()}:\n    cmake -S . -B build && cmake --build build -j2 "
                         "--target bench_decode")


def import_torch() -> tuple[ModuleType, ModuleType]:
    """torch and transformers, or exit 2 with the commands that make the project's venv."""
    try:
        import torch
        import transformers
    except ImportError as e:
        root = repo_root()
        raise BenchError(EXIT_INPUT, (
            f"{sys.executable} cannot import torch and transformers ({e}). Create the project's "
            f"environment (.venv/, the pins of python/requirements.txt) and run with it:\n"
            f"    cd {root} && ./scripts/ensure-venv.sh\n"
            f"    {root / '.venv/bin/python'} bench/vs_torch.py --model DIR ...")) from None
    return torch, transformers


def parse_result_lines(text: str) -> dict[str, list[dict[str, str]]]:
    """bench_decode's `RESULT key=value ...` lines by their phase."""
    out: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if not line.startswith("RESULT "):
            continue
        fields = {}
        for item in line.split()[1:]:
            key, sep, value = item.partition("=")
            if not sep:
                raise BenchError(EXIT_INTERNAL, f"bench_decode: RESULT item {item!r} has no '=': {line}")
            fields[key] = value
        out.setdefault(fields.get("phase", ""), []).append(fields)
    return out


def read_kvrepro_run(text: str, shapes: Shapes) -> KvreproRun:
    res = parse_result_lines(text)
    try:
        (prompt,) = res["prompt"]
        (prefill,) = res["prefill"]
        (decode,) = res["decode"]
        rows = sorted(res["tokens"], key=lambda f: int(f["row"]))
        tokens = [[int(t) for t in f["ids"].split(",")] for f in rows]
        run = KvreproRun(
            prompt_fnv=int(prompt["fnv1a64"], 16), vocab=int(prompt["vocab"]),
            prefill_s=float(prefill["seconds"]), prefill_flops=float(prefill["flops"]),
            decode_s=float(decode["seconds"]), decode_flops_per_step=float(decode["flops_per_step"]),
            matmul_weights_per_token=float(prefill["matmul_weights_per_token"]),
            lm_head_weights=float(prefill["lm_head_weights"]), matmul_path=prefill["matmul"],
            tokens=tokens)
    except (KeyError, ValueError) as e:
        raise BenchError(EXIT_INTERNAL, f"bench_decode: expected one RESULT line each for prompt, "
                         f"prefill and decode and one tokens line per row, with numbers: {e!r}\n"
                         f"{text}") from None
    if len(run.tokens) != shapes.batch or any(len(r) != shapes.new_tokens for r in run.tokens):
        raise BenchError(EXIT_INTERNAL, f"bench_decode: expected {shapes.batch} token rows of "
                         f"{shapes.new_tokens}, found {[len(r) for r in run.tokens]}")
    return run


def run_kvrepro(bench: Path, model: Path, shapes: Shapes, threads: int, prompt_seed: int) -> KvreproRun:
    cmd = [str(bench), "--model", str(model), "--prompt-len", str(shapes.prompt_len),
           "--prefill-len", str(shapes.prompt_len), "--batch", str(shapes.batch),
           "--new-tokens", str(shapes.new_tokens), "--threads", str(threads), "--repeats", "1",
           "--prompt-seed", str(prompt_seed), "--copy-mib", str(BENCH_COPY_MIB), "--result-lines"]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        status = EXIT_INPUT if proc.returncode == 2 else EXIT_FAILED
        raise BenchError(status, f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return read_kvrepro_run(proc.stdout, shapes)


def read_config(transformers: ModuleType, model: Path) -> tuple[Any, list[str]]:
    """config.json as transformers' config class, and the fields read as floats.

    `kvrepro fixture` writes integral floats as JSON integers (a softcap of 15.0 as 15; cJSON
    prints them so), and transformers 5's strict config dataclasses refuse an integer in a field
    typed float only (gemma2's final_logit_softcapping). The value is the same, so such fields are
    converted here, and named in the output."""
    with open(model / "config.json", encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ValueError(f"{model / 'config.json'}: expected an object with a model_type string")
    cls = transformers.CONFIG_MAPPING[data["model_type"]]
    coerced = []
    if dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            kinds = typing.get_args(field.type) or (field.type,)
            value = data.get(field.name)
            if (float in kinds and int not in kinds and isinstance(value, int)
                    and not isinstance(value, bool)):
                data[field.name] = float(value)
                coerced.append(f"{field.name} {value}")
    return cls.from_dict(data), coerced


class TorchSide:
    """transformers' model, loaded once, and the prompt as a tensor."""

    def __init__(self, torch: ModuleType, transformers: ModuleType, model: Path,
                 prompt: list[list[int]], threads: int) -> None:
        self.torch = torch
        torch.set_num_threads(threads)
        transformers.utils.logging.disable_progress_bar()  # the "Loading weights" bar on stderr
        try:
            config, self.coerced = read_config(transformers, model)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                str(model), config=config, dtype=torch.float32, attn_implementation="eager").eval()
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BenchError(EXIT_INPUT, f"--model {model}: transformers cannot load it: {e}") from None
        self.ids = torch.tensor(prompt, dtype=torch.long)
        self.cache_desc = ""

    def run(self, new_tokens: int) -> TorchRun:
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(input_ids=self.ids, use_cache=True, logits_to_keep=1)
            nxt = out.logits[:, -1, :].argmax(-1)
            prefill_s = time.perf_counter() - t0
            cache = out.past_key_values
            steps = [nxt]
            decode_s = 0.0
            for _ in range(new_tokens - 1):
                t0 = time.perf_counter()
                out = self.model(input_ids=nxt[:, None], past_key_values=cache, use_cache=True)
                nxt = out.logits[:, -1, :].argmax(-1)
                decode_s += time.perf_counter() - t0
                cache = out.past_key_values
                steps.append(nxt)
        self.cache_desc = describe_cache(cache)
        tokens = torch.stack(steps, dim=1).tolist()  # (batch, new_tokens)
        return TorchRun(prefill_s=prefill_s, decode_s=decode_s, tokens=tokens)


def describe_cache(cache: Any) -> str:
    """The cache class and its layers' classes, e.g. DynamicCache (2 DynamicSlidingWindowLayer,
    2 DynamicLayer)."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return type(cache).__name__
    counts: dict[str, int] = {}
    for layer in layers:
        counts[type(layer).__name__] = counts.get(type(layer).__name__, 0) + 1
    return f"{type(cache).__name__} ({', '.join(f'{n} {k}' for k, n in counts.items())})"


def pick(values: list[float], stat: str) -> float:
    """The reported throughput of several rounds: their median or their best (largest)."""
    return max(values) if stat == "best" else statistics.median(values)


def first_difference(a: list[list[int]], b: list[list[int]]) -> tuple[int, int] | None:
    for r, (ra, rb) in enumerate(zip(a, b)):
        for s, (x, y) in enumerate(zip(ra, rb)):
            if x != y:
                return r, s
    return None


def print_table(title: str, rows: list[tuple[str, float | None, float | None]]) -> None:
    print(title)
    print(f"  {'':<10} {'kvrepro':>12} {'torch':>12} {'kvrepro/torch':>14}")
    for name, k, t in rows:
        ks = f"{k:12.2f}" if k is not None else f"{'n/a':>12}"
        ts = f"{t:12.2f}" if t is not None else f"{'n/a':>12}"
        rs = f"{k / t:14.3f}" if k is not None and t else f"{'n/a':>14}"
        print(f"  {name:<10} {ks} {ts} {rs}")


def bench(args: argparse.Namespace) -> int:
    shapes = Shapes(batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens)
    model = Path(args.model)
    bench_decode = Path(args.bench_decode) if args.bench_decode else repo_root() / "build" / "bench_decode"
    check_model_dir(model)
    check_bench_decode(bench_decode)
    torch, transformers = import_torch()

    # Round 0 of kvrepro first: it gives the vocabulary the prompt is drawn from.
    kv_runs = [run_kvrepro(bench_decode, model, shapes, args.threads, args.prompt_seed)]
    prompt = splitmix64_prompt(shapes.batch, shapes.prompt_len, args.prompt_seed, kv_runs[0].vocab)
    if prompt_fnv(prompt) != kv_runs[0].prompt_fnv:
        raise BenchError(EXIT_INTERNAL, f"the prompt built here (fnv1a64 0x{prompt_fnv(prompt):016x}) "
                         f"is not bench_decode's (0x{kv_runs[0].prompt_fnv:016x}): the PRNG port "
                         "in vs_torch.py no longer matches model/prng.c")
    side = TorchSide(torch, transformers, model, prompt, args.threads)
    if side.model.config.vocab_size != kv_runs[0].vocab:
        raise BenchError(EXIT_INTERNAL, f"vocab: kvrepro {kv_runs[0].vocab}, transformers "
                         f"{side.model.config.vocab_size}")
    side.run(shapes.new_tokens)  # warm-up, not timed
    torch_runs = [side.run(shapes.new_tokens)]

    print(f"vs_torch: model {model} ({side.model.config.model_type}), batch {shapes.batch}, prompt "
          f"{shapes.prompt_len} tokens (prompt seed {args.prompt_seed}), new tokens "
          f"{shapes.new_tokens} ({shapes.decode_steps} timed decode steps), threads {args.threads}")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}: attention "
          f"{side.model.config._attn_implementation}, {side.model.dtype}, cache {side.cache_desc}, "
          f"torch.get_num_threads() {torch.get_num_threads()}")
    if side.coerced:
        print(f"config.json read with integers as floats where transformers types a float only: "
              f"{', '.join(side.coerced)}")
    print(f"kvrepro: {bench_decode}, OMP_NUM_THREADS={args.threads}, prefill matmul path "
          f"{kv_runs[0].matmul_path}")

    def show_round(i: int) -> None:
        k, t = kv_runs[i], torch_runs[i]
        print(f"round {i + 1}/{args.repeats}: kvrepro prefill {k.prefill_s * 1e3:.2f} ms, decode "
              f"{k.decode_s * 1e3:.2f} ms; torch prefill {t.prefill_s * 1e3:.2f} ms, decode "
              f"{t.decode_s * 1e3:.2f} ms", flush=True)

    show_round(0)
    for i in range(1, args.repeats):
        kv_runs.append(run_kvrepro(bench_decode, model, shapes, args.threads, args.prompt_seed))
        torch_runs.append(side.run(shapes.new_tokens))
        show_round(i)

    k0 = kv_runs[0]
    tokens = shapes.batch * shapes.prompt_len
    rows = shapes.batch * shapes.decode_steps
    kv_prefill = pick([tokens / r.prefill_s for r in kv_runs], args.stat)
    t_prefill = pick([tokens / r.prefill_s for r in torch_runs], args.stat)
    kv_dec = [rows / r.decode_s for r in kv_runs if r.decode_s > 0]
    t_dec = [rows / r.decode_s for r in torch_runs if r.decode_s > 0]
    kv_decode = pick(kv_dec, args.stat) if kv_dec else None
    t_decode = pick(t_dec, args.stat) if t_dec else None
    # GFLOP/s = flops per token x tokens/s, with bench_decode's count for both engines.
    prefill_gflop_per_token = k0.prefill_flops / tokens / 1e9
    decode_gflop_per_token = k0.decode_flops_per_step / shapes.batch / 1e9

    def gf(rate: float | None, per_token: float) -> float | None:
        return None if rate is None else rate * per_token

    stat = "median" if args.stat == "median" else "best"
    print(f"\n{stat} of {args.repeats} rounds, alternating kvrepro and torch (torch warmed up once "
          f"before round 1; bench_decode warms up in every run); GFLOP/s: bench_decode's count, "
          f"2 x {k0.matmul_weights_per_token / 1e6:.2f}M matmul weights x tokens + "
          f"2 x {k0.lm_head_weights / 1e6:.2f}M lm_head x sequences (prefill) or x rows (decode)")
    print_table(f"prefill: {shapes.batch} x {shapes.prompt_len} tokens, one forward",
                [("tokens/s", kv_prefill, t_prefill),
                 ("GFLOP/s", kv_prefill * prefill_gflop_per_token, t_prefill * prefill_gflop_per_token)])
    plural = "s" if shapes.batch > 1 else ""
    print_table(f"decode: {shapes.decode_steps} steps of {shapes.batch} token{plural}",
                [("tokens/s", kv_decode, t_decode),
                 ("GFLOP/s", gf(kv_decode, decode_gflop_per_token), gf(t_decode, decode_gflop_per_token))])
    if len(kv_dec) < len(kv_runs):
        print(f"  ({len(kv_runs) - len(kv_dec)} kvrepro round(s) without a measurable decode: the "
              "full run took no longer than the prefill run; use more --new-tokens)")

    diff = first_difference(k0.tokens, torch_runs[-1].tokens)
    if diff is None:
        print(f"\ngreedy tokens: identical ({shapes.batch} x {shapes.new_tokens}); prompt ids "
              f"identical (fnv1a64 0x{k0.prompt_fnv:016x})")
    else:
        r, s = diff
        print(f"\ngreedy tokens: differ first at row {r} step {s} (kvrepro {k0.tokens[r][s]}, torch "
              f"{torch_runs[-1].tokens[r][s]}): a near-tie in fp32, or a model difference (check it "
              "with the gate); prompt ids identical")
    return 0


def positive(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def seed(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected 0 .. 2^63 - 1 (bench_decode's range), got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vs_torch.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (config.json + model.safetensors)")
    ap.add_argument("--prompt-len", type=positive, default=128, help="prompt tokens per row, L (default 128)")
    ap.add_argument("--batch", type=positive, default=1, help="prompt rows, B (default 1)")
    ap.add_argument("--new-tokens", type=positive, default=32,
                    help="tokens per run, N >= 2: N - 1 timed decode steps (default 32)")
    ap.add_argument("--threads", type=positive, default=len(os.sched_getaffinity(0)),
                    help="torch.set_num_threads and OMP_NUM_THREADS for kvrepro (default: the CPUs "
                    "this process may run on)")
    ap.add_argument("--repeats", type=positive, default=5, help="alternating rounds, R (default 5)")
    ap.add_argument("--stat", choices=("median", "best"), default="median",
                    help="what is reported of the R rounds (default median)")
    ap.add_argument("--prompt-seed", type=seed, default=DEFAULT_PROMPT_SEED,
                    help=f"prompt token ids' seed (default {DEFAULT_PROMPT_SEED}, bench_decode's)")
    ap.add_argument("--bench-decode", default="", help="bench_decode binary (default build/bench_decode "
                    "beside this script's bench/)")
    args = ap.parse_args(argv)
    if args.new_tokens < 2:
        ap.error("--new-tokens: expected N >= 2 (one token from the prefill, N - 1 decode steps)")
    if args.batch > 4096:
        ap.error("--batch: expected B <= 4096 (bench_decode's bound)")
    try:
        return bench(args)
    except BenchError as e:
        print(f"vs_torch: {e}", file=sys.stderr)
        return e.status


if __name__ == "__main__":
    sys.exit(main())
