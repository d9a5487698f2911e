"""kvrepro-hf: capture transformers decodes as kvrepro runs, and plot reports.

  kvrepro-hf capture --model DIR --prompts FILE --max-new-tokens N
                     [--cache LAYER[,LAYER...]] [--mode MODE[,MODE...]]
                     [--attn IMPL[,IMPL...]] [--dtype fp32|bf16] [--repeats R]
                     [--scenario NAME] [--device cpu|cuda[:N]] [--threads T] --out RUN.h5
  kvrepro-hf capture ... (--text TEXT [--text TEXT ...] | --text-file FILE) ...
  kvrepro-hf capture --model DIR --scenario GATE_SCENARIO ... (the gate's batch)
  kvrepro-hf table RUNS.h5 [RUNS.h5 ...] [--gate GATE.h5]
  kvrepro-hf plot REPORT.h5 --out DIR [--window W]
  kvrepro-hf report REPORT.h5 --html OUT.html [--window W]
  kvrepro-hf prompts --model DIR (--text TEXT [--text ...] | --text-file FILE) --out P.json
                     [--no-special-tokens]
  kvrepro-hf show REPORT.h5 --model DIR
  kvrepro-hf convert-gguf FILE.gguf --out DIR [--sliding-window N] [--dtype fp32|bf16]

Exit codes: 0 done, 2 bad input or usage (a message naming the file and
field), 3 internal error; 143 a capture stopped by SIGTERM (timeout(1)),
which writes the runs it completed before the signal. Every argument is checked, against the bounds in
kvrepro/names.py, before a model is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import InputError
from .files import check_out_dir, check_writable, open_regular, read_regular, same_file
from .prompts import SEPARATOR, PromptsFile, check_text, parse_prompts_file, parse_text_file
from .scenarios import NAMES as GATE_SCENARIOS
from .names import (BROKEN, C_ONLY, DTYPE_NAMES, IMPLS, LAYER_ALIASES, LAYERS, MAX_CONFIG_BYTES, MAX_CUDA_INDEX,
                    MAX_HOLD_BYTES, MAX_NAME_BYTES, MAX_NEW_TOKENS, MAX_PROMPT_LEN, MAX_PROMPT_ROWS,
                    MAX_PROMPTS_BYTES, MAX_REPEATS, MAX_THREADS, MAX_VOCAB, MAX_WINDOW, MODES, cache_layers)

EXIT_INPUT = 2
EXIT_STOPPED = 128 + signal.SIGTERM   # as a shell reports a process SIGTERM ended


# ---------------------------------------------------------------- argument types
# Each is an argparse type: a bad value ends in argparse's one-line error
# ("kvrepro-hf capture: error: argument --threads: ...") and exit 2.

def _int_in(lo: int, hi: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        # digits only: int() would also take " 5", "+5" and "1_000"
        if not re.fullmatch(r"-?[0-9]{1,20}", text):
            raise argparse.ArgumentTypeError(f"expected an integer {lo} <= N <= {hi} ({what}), found {text!r}")
        v = int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {lo} <= N <= {hi} ({what}), found {v}")
        return v
    return parse


def _path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a path, found an empty string")
    return text


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",")]
        seen = set()
        for t in items:
            if t not in allowed:
                raise argparse.ArgumentTypeError(f"unknown name {t!r}: expected one of {', '.join(allowed)}")
            if t in seen:
                raise argparse.ArgumentTypeError(f"{t!r} given twice")
            seen.add(t)
        return items
    return parse


def _cache_layers(text: str) -> list[str]:
    """--cache: the layers' own names, aliases resolved (names.cache_layers)."""
    try:
        return cache_layers(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def check_name(text: str, what: str) -> str:
    """A name stored in a 64-byte schema field: 1 to 63 bytes of UTF-8,
    printable (no control characters)."""
    n = len(text.encode("utf-8", "surrogateescape"))
    if n == 0:
        raise InputError(f"{what}: expected a name, found an empty string")
    if n > MAX_NAME_BYTES:
        raise InputError(f"{what}: {text[:40]!r}... is {n} bytes, the report's field holds {MAX_NAME_BYTES}")
    if not text.isprintable():
        raise InputError(f"{what}: {text!r}: expected printable characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what}: {text!r}: not valid UTF-8") from None
    return text


def _scenario(text: str) -> str:
    try:
        return check_name(text, "expected a scenario name")
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("expected a scenario name: ")) from None


def check_device(text: str) -> str:
    """cpu, cuda or cuda:N, as torch spells them (checked again once torch
    is loaded: is the device there)."""
    m = re.fullmatch(r"cpu|cuda(?::([0-9]{1,4}))?", text)
    if m is None or (m.group(1) is not None and int(m.group(1)) > MAX_CUDA_INDEX):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N (0 <= N <= {MAX_CUDA_INDEX}), "
                                         f"found {text!r}")
    return text


class _Once(argparse.Action):
    """Stores the value; an option given twice is refused (silently keeping
    the last would hide a typo in a long command line)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = f"_given_{self.dest}"
        if getattr(namespace, given, False):
            parser.error(f"argument {option_string}: given twice")
        setattr(namespace, given, True)
        setattr(namespace, self.dest, values)


# ---------------------------------------------------------------- inputs

def parse_prompts(path: str, data: bytes) -> list[list[int]]:
    """The token ids of a prompts file (the C gate's --prompts format: a
    JSON array of token-id arrays, or the object form of kvrepro/prompts.py),
    within the reader's bounds."""
    return parse_prompts_file(path, data).prompts


def read_prompts_file(path: str) -> PromptsFile:
    """The prompts file: a regular file (a FIFO would block the read, a
    device never end it) of at most MAX_PROMPTS_BYTES."""
    return parse_prompts_file(path, read_regular(path, MAX_PROMPTS_BYTES, "prompts"))


def read_prompts(path: str) -> list[list[int]]:
    return read_prompts_file(path).prompts


def read_texts(args: argparse.Namespace) -> list[str] | None:
    """--text (each given) or --text-file's prompts, or None when neither."""
    if getattr(args, "text_file", None):
        return parse_text_file(args.text_file, read_regular(args.text_file, MAX_PROMPTS_BYTES, "text"))
    if getattr(args, "text", None):
        return [check_text(t, f"--text {i + 1}") for i, t in enumerate(args.text)]
    return None


def read_model_config(path: str) -> dict[str, Any]:
    """DIR/config.json, as a JSON object (transformers reads the rest)."""
    if not os.path.isdir(path):
        raise InputError(f"{path}: not a directory")
    cfg = os.path.join(path, "config.json")
    if not os.path.lexists(cfg):
        raise InputError(f"{cfg}: missing")
    data = read_regular(cfg, MAX_CONFIG_BYTES, "config.json")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{cfg}: not JSON: {e}") from None
    except RecursionError:
        raise InputError(f"{cfg}: not a config: objects nested too deeply") from None
    if not isinstance(obj, dict):
        raise InputError(f"{cfg}: expected a JSON object")
    return obj


def config_int(cfg: dict[str, Any], name: str, hi: int, where: str) -> int | None:
    """An optional integer field of config.json in 1..hi (None when absent:
    transformers' default applies)."""
    v = cfg.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= hi:
        raise InputError(f"{where}: {name}: expected an integer 1..{hi}, found {json.dumps(v)[:40]}")
    return v


def check_capture_size(n_runs: int, steps: int, prompts: list[list[int]], vocab: int, layers: int) -> None:
    """What the capture holds until it writes the report, against
    MAX_HOLD_BYTES, before the model is loaded: per run the (steps, batch,
    vocab) float32 logits, tokens, margins and hashes, the probes' hashes
    (embed, three per layer, logits) and the prompt."""
    batch, plen = len(prompts), max(len(r) for r in prompts)
    probes = 2 + 3 * layers
    per_run = steps * batch * (vocab * 4 + 4 + 4 + 8 + probes * 8) + batch * plen * 5
    if per_run * n_runs > MAX_HOLD_BYTES:
        raise InputError(f"a capture of {n_runs} runs of {steps} steps x {batch} rows x {vocab} logits needs "
                         f"~{per_run * n_runs / 2**30:.3g} GiB to hold, above the {MAX_HOLD_BYTES >> 30} GiB "
                         "a report's reader takes (KV_REPORT_MAX_READ_BYTES): fewer --max-new-tokens, "
                         "--repeats, --cache, --mode or --attn")


def gate_scenario(args: argparse.Namespace, config: dict[str, Any], cfg_path: str) -> Any:
    """The C gate's batch of scenario --scenario for this model
    (kvrepro/scenarios.py), when neither --prompts, --text nor --text-file
    was given: what `kvrepro gate --model DIR --scenarios NAME` decodes."""
    from . import scenarios

    if args.scenario not in scenarios.NAMES:
        given = f"--scenario {args.scenario!r} is not" if args.scenario else "no --scenario names"
        raise InputError(f"one of --prompts, --text or --text-file is required, or --scenario naming a scenario "
                         f"of the gate to build its batch ({given} one of: {', '.join(scenarios.NAMES)})")
    if config_int(config, "vocab_size", MAX_VOCAB, cfg_path) is None:
        raise InputError(f"{cfg_path}: vocab_size: missing (--scenario {args.scenario} draws the batch's "
                         "ids below it)")
    w = scenarios.window_of(config)
    if w > MAX_PROMPT_LEN // 2:
        raise InputError(f"{cfg_path}: sliding_window {w}: --scenario {args.scenario}'s prompts would pass the "
                         f"{MAX_PROMPT_LEN} tokens a report's prompt holds")
    return scenarios.build(args.scenario, config)


def _check_out_not_input(out: str, inputs: Sequence[str]) -> None:
    for path in inputs:
        if same_file(out, path):
            raise InputError(f"{out}: is an input of this capture ({path}): choose another --out")


def _check_device_present(device: str) -> None:
    import torch

    if not device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA device here (torch.cuda.is_available() is false)")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise InputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


# ---------------------------------------------------------------- commands

def timing_text(run: Any) -> str:
    """A run's timings in one phrase: the steady per-step time and the
    steps it is the median of, the prefill."""
    ms = run.step_ms_steady
    n = 0 if run.step_ms is None else max(0, len(run.step_ms) - run.steady_from)
    steady = (f"{ms:.3f} ms/step steady (median of decode steps {run.steady_from}..{run.steady_from + n - 1})"
              if n else f"no steady step (warm-up ends at decode step {run.steady_from})")
    return f"{steady}, prefill {run.prefill_ms:.1f} ms"


def cmd_capture(args: argparse.Namespace) -> int:
    # Everything that can be checked without torch first: a bad command
    # line costs no import and no model load.
    check_writable(args.out, "--out")
    config = read_model_config(args.model)
    model_name = os.path.basename(os.path.abspath(args.model))
    check_name(model_name, f"{args.model}: the model's name (its directory's)")
    cfg_path = os.path.join(args.model, "config.json")
    vocab = config_int(config, "vocab_size", MAX_VOCAB, cfg_path)
    texts = read_texts(args)
    built = None   # the C gate's scenario batch, when no prompts were given
    if texts is None and not args.prompts:
        built = gate_scenario(args, config, cfg_path)
    if built is not None:
        source = f"scenario {built.name}"
        default_scenario = built.name
        pfile = PromptsFile(prompts=built.prompts)
    elif texts is not None:
        from .prompts import check_has_tokenizer, tokenize

        check_has_tokenizer(args.model)
        source = args.text_file or "--text"
        default_scenario = os.path.splitext(os.path.basename(args.text_file))[0] if args.text_file else "text"
        pfile = tokenize(args.model, texts, vocab=vocab)
    else:
        source = args.prompts
        default_scenario = os.path.splitext(os.path.basename(args.prompts))[0]
        pfile = read_prompts_file(args.prompts)
    prompts = pfile.prompts
    if args.max_new_tokens is None:
        if built is None:
            raise InputError("--max-new-tokens: required with --prompts, --text or --text-file "
                             "(a --scenario batch built here decodes the gate's steps by default)")
        args.max_new_tokens = built.new_tokens
    scenario = args.scenario or check_name(default_scenario, f"{source}: the scenario's name (give --scenario)")
    n_layers = config_int(config, "num_hidden_layers", 1 << 16, cfg_path) or 0
    if vocab is not None:
        n_runs = len(args.attn) * len(args.cache) * len(args.mode) * args.repeats
        check_capture_size(n_runs, args.max_new_tokens, prompts, vocab, n_layers)
    for i, row in enumerate(prompts):
        for j, t in enumerate(row):
            if isinstance(vocab, int) and t >= vocab:
                raise InputError(f"{source}: prompt {i} token {j}: id {t} is not below the "
                                 f"model's vocab_size {vocab} ({args.model}/config.json)")
    try:
        model_files = [os.path.join(args.model, n) for n in os.listdir(args.model)]
    except OSError as e:
        raise InputError(f"{args.model}: cannot list: {e.strerror or e}") from None
    _check_out_not_input(args.out, [p for p in (args.prompts, args.text_file) if p] + model_files)

    import torch

    from .capture import root_attributes
    from .report import write_report

    _check_device_present(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    runs: list[Any] = []
    # SIGTERM (timeout(1), a scheduler's limit) stops the capture between
    # two Python steps; the runs completed by then are written, so a stage
    # with a time limit keeps what it measured
    previous = signal.signal(signal.SIGTERM, _stop)
    stopped = ""
    try:
        _capture_all(args, prompts, scenario, pfile, vocab, runs)
    except Stopped as e:
        stopped = str(e)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped and not runs:
        print(f"kvrepro-hf: capture stopped by {stopped} before a run completed: {args.out} not written",
              file=sys.stderr, flush=True)
        return EXIT_STOPPED
    write_report(args.out, runs, root_attributes(args.device, " ".join(sys.argv)))
    if stopped:
        print(f"kvrepro-hf: capture stopped by {stopped}: wrote the {len(runs)} runs completed before it to "
              f"{args.out}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    print(f"wrote {len(runs)} runs to {args.out}")
    return 0


class Stopped(BaseException):
    """Raised by SIGTERM's handler during a capture: a BaseException, so no
    `except Exception` on the way (a run's failure is recorded as such)
    takes it for the engine's failure."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def _capture_all(args: argparse.Namespace, prompts: list[list[int]], scenario: str, pfile: PromptsFile,
                 vocab: int | None, runs: list[Any]) -> None:
    """Every configuration's runs, appended to runs as each is done."""
    from .capture import CaptureSpec, ProbeMemo, capture_runs, load_or_refusal, skip_runs

    for impl in args.attn:
        model, refusal = None, ""
        memo = ProbeMemo()   # the model's probe slices hashed so far: each run hashes what changed
        for layer in args.cache:
            for mode in args.mode:
                spec = CaptureSpec(model_dir=args.model, prompts=prompts, scenario=scenario,
                                   new_tokens=args.max_new_tokens, layer=layer, mode=mode, impl=impl,
                                   dtype=args.dtype, repeats=args.repeats, device=args.device,
                                   texts=pfile.texts,
                                   tokenizer=(pfile.tokenizer_text() if pfile.texts is not None
                                              and pfile.tokenizer is not None else None))
                if model is None and not refusal:
                    model, refusal = load_or_refusal(spec)
                got = (capture_runs(spec, model, memo) if model is not None
                       else skip_runs(spec, refusal, vocab if isinstance(vocab, int) else 0))
                for r in got:
                    line = f"{r.variant} {r.backend}/{r.mode}/r{r.repeat}: "
                    if r.skipped:
                        line += f"skipped: {r.skip_reason}"
                    else:
                        line += f"{r.steps} steps, {timing_text(r)}"
                        if r.mode != "eager":
                            line += f", {r.graphs_captured} decode graphs, {r.recompiles} recompiles"
                            if r.extra.get("first_recompile"):
                                line += f" (first: {r.extra['first_recompile'][:160]})"
                            if "cudagraph_records" in r.extra:
                                line += f", {r.extra['cudagraph_records']} CUDA graphs recorded"
                            if r.extra.get("cudagraph_skips"):
                                line += (f"; CUDA graphs skipped {r.extra['cudagraph_skips']} times, its steps are "
                                         f"not replays ({str(r.extra.get('cudagraph_skip', ''))[:160]})")
                    runs.append(r)   # before the line: a SIGTERM after it finds the run kept
                    print(line, flush=True)


# plot's figures (plot.FIGURES, without importing matplotlib for the checks)
FIGURES = ("summary.png", "error_vs_reference.png", "divergence_map.png", "graphs_per_decode.png")


def cmd_plot(args: argparse.Namespace) -> int:
    # the checks that need neither h5py nor matplotlib first (plot_report
    # makes them again): a bad command line is refused at once
    os.close(open_regular(args.report, "report"))
    check_out_dir(args.out, FIGURES, "--out")

    from .plot import FIGURES as PLOT_FIGURES
    from .plot import plot_report

    assert PLOT_FIGURES == FIGURES

    for path in plot_report(args.report, args.out, window=args.window):
        print(path)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    # the checks that need neither h5py nor matplotlib first
    # (write_html_report makes them again)
    os.close(open_regular(args.report, "report"))
    check_writable(args.html, "--html")

    from .html_report import write_html_report

    print(write_html_report(args.report, args.html, window=args.window))
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from .table import table_lines

    for line in table_lines(args.captures, args.gate):
        print(line)
    return 0


def cmd_prompts(args: argparse.Namespace) -> int:
    from .files import publish
    from .prompts import check_has_tokenizer, dump_prompts_file, tokenize

    check_writable(args.out, "--out")
    texts = read_texts(args)
    assert texts is not None   # argparse requires --text or --text-file
    check_has_tokenizer(args.model)
    vocab = None
    if os.path.lexists(os.path.join(args.model, "config.json")):
        vocab = config_int(read_model_config(args.model), "vocab_size", MAX_VOCAB,
                           os.path.join(args.model, "config.json"))
    inputs = [os.path.join(args.model, n) for n in os.listdir(args.model)]
    if args.text_file:
        inputs.append(args.text_file)
    for path in inputs:
        if same_file(args.out, path):
            raise InputError(f"{args.out}: is an input ({path}): choose another --out")
    pf = tokenize(args.model, texts, add_special_tokens=not args.no_special_tokens, vocab=vocab)
    data = dump_prompts_file(pf)
    publish(args.out, lambda f: f.write(data), "--out")
    lens = ", ".join(str(len(r)) for r in pf.prompts)
    print(f"wrote {len(pf.prompts)} prompts ({lens} tokens) to {args.out}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    os.close(open_regular(args.report, "report"))
    from .prompts import load_tokenizer
    from .show import show_report

    tok = load_tokenizer(args.model)
    for line in show_report(args.report, tok, args.model):
        print(line)
    return 0


def cmd_convert_gguf(args: argparse.Namespace) -> int:
    from .gguf_convert import convert

    cfg = convert(args.gguf, args.out, args.sliding_window, args.dtype)
    window = cfg.get("sliding_window")
    print(f"wrote {args.out}: {cfg['model_type']} ({cfg['architectures'][0]}), {cfg['num_hidden_layers']} layers, "
          f"vocab {cfg['vocab_size']}, sliding_window {window}, {cfg['dtype']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line; every option has a type that bounds it (the test
    test_cli_errors runs each with bad values)."""
    ap = argparse.ArgumentParser(prog="kvrepro-hf", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="record greedy decodes as kvrepro runs", allow_abbrev=False)
    c.add_argument("--model", required=True, type=_path, action=_Once, help="Hugging Face checkpoint directory")
    src = c.add_mutually_exclusive_group()
    src.add_argument("--prompts", type=_path, action=_Once,
                     help="JSON array of token-id arrays (left-padded batch), or the object form "
                          "`kvrepro-hf prompts` writes; a regular file of at most "
                          f"{MAX_PROMPTS_BYTES >> 20} MiB, {MAX_PROMPT_ROWS} rows of {MAX_PROMPT_LEN} tokens. "
                          "Without --prompts, --text or --text-file, --scenario names the gate's scenario "
                          f"whose batch is decoded ({', '.join(GATE_SCENARIOS)}): the ids `kvrepro gate` "
                          "draws for this model with its default prompt seed")
    _text_options(src)
    c.add_argument("--max-new-tokens", type=_int_in(1, MAX_NEW_TOKENS, "longer than any model's context"),
                   default=None, action=_Once, metavar="N",
                   help="decode steps; required with --prompts, --text or --text-file (a gate scenario's "
                        "batch: the gate's steps by default)")
    aliases = ", ".join(f"{a} (= {n})" for a, n in LAYER_ALIASES.items())
    c.add_argument("--cache", default=list(LAYERS), type=_cache_layers, action=_Once,
                   help=f"comma-separated: {', '.join(LAYERS)} (default all); test-only: {', '.join(BROKEN)}; "
                        f"the C gate's name for the same layout: {aliases}; C-only: {', '.join(C_ONLY)}")
    c.add_argument("--mode", default=["eager"], type=_names(MODES), action=_Once,
                   help=f"comma-separated: {', '.join(MODES)}")
    c.add_argument("--attn", default=["eager"], type=_names(IMPLS), action=_Once,
                   help=f"comma-separated: {', '.join(IMPLS)}")
    c.add_argument("--dtype", default="fp32", choices=DTYPE_NAMES, action=_Once)
    c.add_argument("--repeats", type=_int_in(1, MAX_REPEATS, "runs per variant and mode"), default=1,
                   action=_Once, metavar="R")
    c.add_argument("--scenario", default=None, type=_scenario, action=_Once,
                   help=f"scenario name, at most {MAX_NAME_BYTES} bytes (default: the prompts file's name); "
                        "without a prompt source, the gate's scenario whose batch is built (see --prompts)")
    c.add_argument("--device", default="cpu", type=check_device, action=_Once, help="cpu or cuda[:N]")
    c.add_argument("--threads", type=_int_in(0, MAX_THREADS, "torch CPU threads; 0 = torch's default"),
                   default=1, action=_Once, metavar="T",
                   help="torch CPU threads (default 1; 0 = torch's default)")
    c.add_argument("--out", required=True, type=_path, action=_Once,
                   help="report to write (HDF5, docs/SCHEMA.md): a new name or a regular file")
    t = sub.add_parser("prompts", help="tokenize texts into a prompts file", allow_abbrev=False,
                       description="Tokenizes each text with the model directory's own tokenizer "
                                   "(AutoTokenizer), adding the special tokens transformers' generate "
                                   "adds (add_special_tokens=True: e.g. Gemma's BOS), and writes the "
                                   "prompts file the gate and the capture read, in its object form: "
                                   "the token ids, the texts and the tokenizer's identity (name, "
                                   "vocabulary size, sha256 of its vocabulary).")
    t.add_argument("--model", required=True, type=_path, action=_Once,
                   help="Hugging Face checkpoint directory holding its tokenizer "
                        "(tokenizer.json, tokenizer.model or tokenizer_config.json)")
    _text_options(t.add_mutually_exclusive_group(required=True))
    t.add_argument("--no-special-tokens", action="store_true",
                   help="tokenize without the special tokens (no BOS): not what generate sees")
    t.add_argument("--out", required=True, type=_path, action=_Once,
                   help="prompts file to write (JSON): a new name or a regular file")
    sh = sub.add_parser("show", help="print a report's prompts and decodes as text", allow_abbrev=False)
    sh.add_argument("report", type=_path, help="a report (HDF5) of `kvrepro gate` or `kvrepro-hf capture`")
    sh.add_argument("--model", required=True, type=_path, action=_Once,
                    help="model directory whose tokenizer decodes the ids (the one the prompts were "
                         "tokenized with)")
    g = sub.add_parser("convert-gguf", help="dequantize a GGUF checkpoint into a Hugging Face directory",
                       allow_abbrev=False,
                       description="Dequantizes a GGUF checkpoint (llama.cpp's format) through transformers "
                                   "and writes a Hugging Face directory: config.json with every field "
                                   "resolved, model.safetensors, tokenizer.json and tokenizer_config.json. "
                                   "Architectures: llama (llama.cpp writes Mistral as llama: give "
                                   "--sliding-window to get a mistral), gemma2, gemma3, qwen2; refused with "
                                   "the reason: gpt-oss, RoPE scaling (transformers' GGUF reader drops "
                                   "both), a tensor type gguf cannot dequantize. Works offline.")
    g.add_argument("gguf", type=_path, metavar="FILE", help="the .gguf file (one file, not a split one)")
    g.add_argument("--out", required=True, type=_path, action=_Once,
                   help="directory to create: a new name or an empty directory")
    g.add_argument("--sliding-window", type=_int_in(1, MAX_WINDOW, "a sliding window"), default=None,
                   action=_Once, metavar="N",
                   help="make it a sliding-window model of window N (at most max_position_embeddings): "
                        "llama weights become model_type mistral; qwen2 slides on every layer; gemma2, "
                        "gemma3 and mistral take N as their sliding_window")
    g.add_argument("--dtype", default="fp32", choices=DTYPE_NAMES, action=_Once,
                   help="weights written as float32 (default) or bfloat16")
    p = sub.add_parser("plot", help="render a report's runs as PNGs", allow_abbrev=False)
    p.add_argument("report", type=_path)
    p.add_argument("--out", required=True, type=_path, action=_Once, help="directory for the PNGs")
    p.add_argument("--window", type=_int_in(1, MAX_WINDOW, "a sliding window"), default=None, metavar="W",
                   action=_Once,
                   help="sliding window W, for runs without a 'window' attribute (marks where the window is full)")
    h = sub.add_parser("report", help="write a report as one self-contained HTML page", allow_abbrev=False,
                       description="Writes one HTML page a reviewer opens from a CI artifact: the verdict, the "
                                   "model x scenario grid, every failure with its bisect command, the skips, "
                                   "the tolerances the gate applied, each model's window and the figures of "
                                   "`plot`, inline (no file or URL beside it).")
    h.add_argument("report", type=_path, help="a report (HDF5) of `kvrepro gate` or `kvrepro-hf capture`")
    h.add_argument("--html", required=True, type=_path, action=_Once,
                   help="page to write: a new name or a regular file")
    h.add_argument("--window", type=_int_in(1, MAX_WINDOW, "a sliding window"), default=None, metavar="W",
                   action=_Once, help="sliding window W, for a report that records none")
    tb = sub.add_parser("table", help="one line per captured configuration: verdicts, graphs, per-step time",
                        allow_abbrev=False,
                        description="Prints one line per (dtype, cache layer, attention, mode) of the captures: "
                                    "the runs, the gate's reference, compiled-vs-eager and repeat verdicts "
                                    "(with --gate, the C gate's report on them), the decode "
                                    "graphs over their budget, the recompiles, the steady per-step time and the "
                                    "prefill's (median over the runs); skipped and failed runs' reasons and the "
                                    "first failure of each line follow the table.")
    tb.add_argument("captures", nargs="+", type=_path, metavar="RUNS.h5",
                    help="captures of `kvrepro-hf capture` (their timings are theirs: a gate report keeps none)")
    tb.add_argument("--gate", type=_path, action=_Once, metavar="GATE.h5", default=None,
                    help="the report of the C gate judging these captures (its external runs)")
    return ap


def _text_options(group: argparse._MutuallyExclusiveGroup) -> None:
    group.add_argument("--text", action="append", type=str, metavar="TEXT",
                       help="a prompt's text (give it once per prompt)")
    group.add_argument("--text-file", type=_path, action=_Once, metavar="FILE",
                       help=f"UTF-8 text file of prompts separated by lines holding only '{SEPARATOR}' "
                            "(each prompt is the lines between, without the newline before a separator)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"capture": cmd_capture, "plot": cmd_plot, "prompts": cmd_prompts, "show": cmd_show,
                "convert-gguf": cmd_convert_gguf, "report": cmd_report, "table": cmd_table}
    try:
        return commands[args.cmd](args)
    except InputError as e:
        print(f"kvrepro-hf: {e}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
