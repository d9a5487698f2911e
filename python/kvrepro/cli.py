"""kvrepro-hf: capture transformers decodes as kvrepro runs, and plot reports.

  kvrepro-hf capture --model DIR --prompts FILE --max-new-tokens N
                     [--cache LAYER[,LAYER...]] [--mode MODE[,MODE...]]
                     [--attn IMPL[,IMPL...]] [--dtype fp32|bf16] [--repeats R]
                     [--scenario NAME] [--device cpu|cuda] [--threads T] --out RUN.h5
  kvrepro-hf plot REPORT.h5 --out DIR [--window W]

Exit codes: 0 done, 2 bad input or usage (a message naming the file and
field), 3 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .caches import BROKEN, LAYERS
from .errors import InputError

EXIT_INPUT = 2


def _list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [t.strip() for t in text.split(",")]
    seen = set()
    for t in items:
        if t not in allowed:
            raise InputError(f"--{what}: unknown name {t!r}: expected one of {', '.join(allowed)}")
        if t in seen:
            raise InputError(f"--{what}: {t!r} given twice")
        seen.add(t)
    return items


def read_prompts(path: str) -> list[list[int]]:
    """A JSON array of non-empty arrays of token ids (the C gate's --prompts format)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: expected a non-empty JSON array of token-id arrays")
    for i, row in enumerate(data):
        if not isinstance(row, list) or not row:
            raise InputError(f"{path}: prompt {i}: expected a non-empty array of token ids")
        for j, t in enumerate(row):
            if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t > 2**31 - 1:
                raise InputError(f"{path}: prompt {i} token {j}: expected a token id (integer >= 0)")
    return data


def check_model_dir(path: str) -> None:
    cfg = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise InputError(f"{path}: not a directory")
    if not os.path.isfile(cfg):
        raise InputError(f"{cfg}: missing")


def cmd_capture(args: argparse.Namespace) -> int:
    import torch

    from .capture import IMPLS, MODES, CaptureSpec, capture, load_or_refusal, root_attributes, skip_runs
    from .report import write_report

    layers = _list(args.cache, LAYERS + BROKEN, "cache")
    modes = _list(args.mode, MODES, "mode")
    impls = _list(args.attn, IMPLS, "attn")
    if args.max_new_tokens < 1:
        raise InputError("--max-new-tokens: expected N >= 1")
    if args.repeats < 1:
        raise InputError("--repeats: expected R >= 1")
    check_model_dir(args.model)
    prompts = read_prompts(args.prompts)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        raise InputError(f"{args.out}: cannot create: directory {out_dir} is not writable")
    if os.path.isdir(args.out):
        raise InputError(f"{args.out}: cannot create: is a directory")
    if args.threads:
        torch.set_num_threads(args.threads)
    scenario = args.scenario or os.path.splitext(os.path.basename(args.prompts))[0]
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        vocab = json.load(f).get("vocab_size")
    for i, row in enumerate(prompts):
        for j, t in enumerate(row):
            if isinstance(vocab, int) and t >= vocab:
                raise InputError(f"{args.prompts}: prompt {i} token {j}: id {t} is not below the "
                                 f"model's vocab_size {vocab} ({args.model}/config.json)")
    runs = []
    for impl in impls:
        model, refusal = None, ""
        for layer in layers:
            for mode in modes:
                spec = CaptureSpec(model_dir=args.model, prompts=prompts, scenario=scenario,
                                   new_tokens=args.max_new_tokens, layer=layer, mode=mode, impl=impl,
                                   dtype=args.dtype, repeats=args.repeats, device=args.device)
                if model is None and not refusal:
                    model, refusal = load_or_refusal(spec)
                got = (capture(spec, model) if model is not None
                       else skip_runs(spec, refusal, vocab if isinstance(vocab, int) else 0))
                for r in got:
                    line = f"{r.variant} {r.backend}/{r.mode}/r{r.repeat}: "
                    if r.skipped:
                        line += f"skipped: {r.skip_reason}"
                    else:
                        line += f"{r.steps} steps"
                        if r.mode != "eager":
                            line += f", {r.graphs_captured} decode graphs, {r.recompiles} recompiles"
                            if r.extra.get("first_recompile"):
                                line += f" (first: {r.extra['first_recompile'][:160]})"
                    print(line, flush=True)
                runs.extend(got)
    write_report(args.out, runs, root_attributes(args.device, " ".join(sys.argv)))
    print(f"wrote {len(runs)} runs to {args.out}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .plot import plot_report

    for path in plot_report(args.report, args.out, window=args.window):
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvrepro-hf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture", help="record greedy decodes as kvrepro runs")
    c.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    c.add_argument("--prompts", required=True, help="JSON array of token-id arrays (left-padded batch)")
    c.add_argument("--max-new-tokens", type=int, required=True)
    c.add_argument("--cache", default=",".join(LAYERS),
                   help=f"comma-separated: {', '.join(LAYERS)} (default all); test-only: {', '.join(BROKEN)}")
    c.add_argument("--mode", default="eager", help="comma-separated: eager, compile, reduce-overhead")
    c.add_argument("--attn", default="eager", help="comma-separated: eager, sdpa, flex_attention")
    c.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    c.add_argument("--repeats", type=int, default=1)
    c.add_argument("--scenario", default="", help="scenario name (default: the prompts file's name)")
    c.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    c.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1; 0 = torch's default)")
    c.add_argument("--out", required=True, help="report to write (HDF5, docs/SCHEMA.md)")
    p = sub.add_parser("plot", help="render a report's runs as PNGs")
    p.add_argument("report")
    p.add_argument("--out", required=True, help="directory for the PNGs")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="sliding window W, for runs without a 'window' attribute (marks where the window is full)")
    args = ap.parse_args(argv)
    try:
        return cmd_capture(args) if args.cmd == "capture" else cmd_plot(args)
    except InputError as e:
        print(f"kvrepro-hf: {e}", file=sys.stderr)
        return EXIT_INPUT


if __name__ == "__main__":
    sys.exit(main())
