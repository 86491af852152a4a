"""``emunum`` command line: ``emunum formats | units | report | tta`` (more subcommands register below)."""
from __future__ import annotations

import argparse
import sys

from .formats import BLOCK_PRESETS, MXPLUS_PRESETS, POSIT_PRESETS, FloatFormat, PRESETS, TABLE_PRESETS, get_format


def formats_table() -> str:
    head = f"{'name':<12} {'kind':<6} {'e':>2} {'m':>2} {'bias':>5} {'special':<7} {'max':>13} " \
           f"{'min normal':>13} {'min subnorm':>13} {'eps':>11}"
    rows = [head, "-" * len(head)]
    for name, f in PRESETS.items():
        if isinstance(f, FloatFormat):
            rows.append(f"{name:<12} {'float':<6} {f.exp:>2} {f.man:>2} {f.bias:>5} {f.special.name.lower():<7} "
                        f"{f.max:>13.6g} {f.min_normal:>13.6g} {f.min_subnormal:>13.6g} {f.eps:>11.4g}")
        else:
            kind = "fixed" if f.signed else "ufixed"
            rows.append(f"{name:<12} {kind:<6} {'':>2} {f.frac_bits:>2} {'':>5} {'':<7} {f.max:>13.6g} "
                        f"{f.eps:>13.6g} {f.eps:>13.6g} {f.eps:>11.4g}")
    return "\n".join(rows)


def block_formats_table() -> str:
    """Block presets (MX+ included): element, block, scale format and rule, outer (second-level) scale, 4/6."""
    presets = {**BLOCK_PRESETS, **MXPLUS_PRESETS}
    w = max(12, *(len(n) for n in presets))
    head = (f"{'block format':<{w}} {'element':<9} {'block':>7} {'scale':<7} {'rule':<5} {'outer':<6} "
            f"{'bits/elem':>9} 4/6")
    rows = [head, "-" * len(head)]
    for name, f in presets.items():
        bs = "x".join(map(str, f.block_size)) if isinstance(f.block_size, tuple) else str(f.block_size)
        fos = "-" if f.four_over_six is None else f"{f.four_over_six.metric.value},{f.four_over_six.bound}"
        rows.append(f"{name:<{w}} {f.element.name:<9} {bs:>7} {f.scale.name:<7} {f.scale_rule.value:<5} "
                    f"{f.outer_scale.value:<6} {f.bits:>9.4g} {fos}")
    rows.append("<mx preset>_<floor|ceil|even|rceil>: the same preset with that power-of-two scale rule")
    return "\n".join(rows)


def posit_formats_table() -> str:
    head = f"{'posit':<12} {'bits':>4} {'es':>2} {'max (maxpos)':>13} {'min_positive':>13}"
    rows = [head, "-" * len(head)]
    for name, f in POSIT_PRESETS.items():
        rows.append(f"{name:<12} {f.nbits:>4} {f.es:>2} {f.max:>13.6g} {f.min_positive:>13.6g}")
    rows.append("any posit<n>_<es>: n 2..32, es 0..5 (posit<n> has es=2)")
    return "\n".join(rows)


LNS_EXAMPLES = ("lns4_3", "lns5_10", "ulns4_4")


def codebook_formats_table() -> str:
    """Codebooks (TableFormat presets) and example logarithmic formats (LogFormat, by name)."""
    head = f"{'codebook':<12} {'values':>6} {'bits':>4} {'min':>10} {'max':>10} {'min |x|>0':>10}"
    rows = [head, "-" * len(head)]
    for name, f in TABLE_PRESETS.items():
        v = f.values()
        rows.append(f"{name:<12} {f.n:>6} {f.bits:>4} {f.min:>10.4g} {f.max:>10.4g} {abs(v[v != 0]).min():>10.4g}")
    for name in LNS_EXAMPLES:
        f = get_format(name)
        rows.append(f"{name:<12} {'':>6} {f.bits:>4} {f.min:>10.4g} {f.max:>10.4g} {f.min_positive:>10.4g}")
    rows.append("lns<int_bits>_<frac_bits> / ulns...: any LogFormat by name")
    rows.append("p3109_k<K>p<P>[u][f]: any IEEE P3109 format by name (emunum.P3109Format; u unsigned, f finite)")
    rows.append("emunum.CustomFormat(to_code, from_code, nbits): your own type from two njit functions (no name)")
    return "\n".join(rows)


def _cmd_formats(args) -> int:
    print(formats_table())
    print()
    print(block_formats_table())
    print()
    print(posit_formats_table())
    print()
    print(codebook_formats_table())
    return 0


def units_table() -> str:
    """The tensor-core MAD-unit presets (name, datapath, source of the parameters), then the
    matrix-instruction presets (``emunum.mad.mma.MMA_PRESETS``)."""
    from .mad import MADUnit
    from .mad.presets import ALIASES, describe

    rows = []
    for name, src in describe():
        rows += [name, f"    {MADUnit.preset(name)}", f"    source: {src}"]
    rows.append("aliases: " + ", ".join(f"{a} -> {b}" for a, b in ALIASES.items()) + " (e.g. h200_fp8_e4m3)")
    return "\n".join(rows) + "\n\n" + mma_units_table()


def mma_units_table() -> str:
    """The matrix-instruction presets: datapath kind, element, K, products per step, fraction bits F of the
    step sum, output fraction bits, block scales, and the MMA-Sim instruction each follows."""
    from .mad.mma import MMA_PRESETS

    head = (f"{'matrix instruction':<20} {'kind':<13} {'element':<9} {'k':>3} {'terms':>5} {'F':>3} {'out':>3} "
            "scales")
    rows = [head, "-" * len(head)]
    for name, u in MMA_PRESETS.items():
        scales = f"{u.scale} x{u.block}" if u.scale else "-"
        rows += [f"{name:<20} {u.kind.name.lower():<13} {u.element:<9} {u.k:>3} {u.terms:>5} {u.frac_bits:>3} "
                 f"{u.out_man:>3} {scales}", f"    source: {u.source}"]
    rows.append("use: patch(model, fmt, mad=<name>) or emunum.mad.scaled_mm(a, a_scale, b, b_scale, c, <name>)")
    return "\n".join(rows)


def _cmd_units(args) -> int:
    print(units_table())
    return 0


def _write(text: str, out) -> None:
    """The table to stdout, or to the file ``out`` (analysis.files: a new regular file, never through a
    link; RefusedWrite otherwise)."""
    if out is None:
        sys.stdout.write(text)
    else:
        from .analysis import files

        files.write_bytes(out, text.encode("utf-8"))
        print(f"wrote {out}", file=sys.stderr)


def _fail(command: str, err: Exception) -> int:
    print(f"emunum {command}: error: {err}", file=sys.stderr)
    return 2


def _notes(notes) -> None:
    for n in dict.fromkeys(notes):
        print(f"note: {n}", file=sys.stderr)


def _cmd_report(args) -> int:
    from pathlib import Path

    from .analysis import curves, files, report

    notes: list[str] = []
    try:
        how = report.OutputFormat.parse(args.format, "--format")
        runs = report.load_sweep(args.sweep, notes)
        rep = report.summarize(runs, args.baseline)
        _write(report.render(rep, how), args.out)
    except ValueError as e:
        _notes(notes)
        return _fail("report", e)
    if how == report.OutputFormat.CSV:
        for n in rep.notes:
            print(f"note: {n}", file=sys.stderr)
    if args.until_ci is not None:
        from .analysis import sequential

        try:
            start = min(sequential.Rule.start, max(2, args.seed_cap))
            rule = sequential.Rule(rel=args.until_ci, cap=args.seed_cap, start=start)
            decisions = sequential.check_sweep(runs, args.baseline, rule)
        except ValueError as e:
            return _fail("report", e)
        for name, d in decisions:
            print(f"seeds: {d.seeds} per format ({name}); {d.message}")
    code = 0
    if not args.no_plot:
        path = Path(args.plot) if args.plot else Path(args.sweep) / "convergence.png"
        loss_path = path.with_name("loss.png" if not args.plot else f"{path.stem}_loss{path.suffix or '.png'}")
        for plot, where in ((curves.convergence_plot, path), (curves.loss_plot, loss_path)):
            try:
                plot(runs, where, args.baseline, notes)
                print(f"wrote {where}", file=sys.stderr)
            except files.RefusedWrite as e:  # a link or special file planted where the plot goes
                print(f"emunum report: error: {e}", file=sys.stderr)
                code = 2
            except (ValueError, OSError) as e:  # no curves, or a read-only sweep folder: the table stands
                print(f"note: no plot: {e}", file=sys.stderr)
    _notes(notes)
    return code


def _cmd_tta(args) -> int:
    from .analysis import report, tta

    if args.sweep is None:
        return _fail("tta", ValueError(
            "no sweep directory given; put it before --seconds-per-iteration, which takes every NAME=SECONDS "
            "that follows it (emunum tta SWEEP --seconds-per-iteration fp32=0.031 fp8=0.012)"))
    notes: list[str] = []
    try:
        how = report.OutputFormat.parse(args.format, "--format")
        runs = report.load_sweep(args.sweep, notes)
        rep = report.summarize(runs, args.baseline)
        formats = [s.format for s in rep.summaries]
        sources, extra = {}, []
        if args.seconds_per_iteration is not None:
            times = tta.parse_pairs(args.seconds_per_iteration)
            tta.check_known(times, formats, "--seconds-per-iteration")
        elif args.sim is not None:
            times = tta.load_sim(args.sim)
            tta.check_known(times, formats, f"--sim {args.sim}")
        else:
            from .analysis.flops import Hardware

            hw = Hardware.load(args.hardware)
            times, sources, extra = tta.roofline_times(runs, hw)
            extra.append(f"hardware {hw.name}: peak FLOP/s by width "
                         + ", ".join(f"{w}-bit {p:.4g}" for w, p in hw.peak_flops)
                         + f"; memory {hw.memory_bandwidth:.4g} B/s" + (f" ({hw.source})" if hw.source else ""))
        out = tta.combine(rep.summaries, times, args.baseline, sources)
        out = tta.TTAReport(out.rows, out.baseline, out.notes + tuple(extra) + rep.notes)
        _write(tta.render(out, how), args.out)
    except ValueError as e:
        _notes(notes)
        return _fail("tta", e)
    _notes(notes)
    if how == report.OutputFormat.CSV:
        for n in out.notes:
            print(f"note: {n}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emunum", description="emunum: reduced-precision numerics emulation")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="print the preset format table")
    f.set_defaults(func=_cmd_formats)
    u = sub.add_parser("units", help="list the MAD-unit (tensor-core) presets with their sources")
    u.set_defaults(func=_cmd_units)

    r = sub.add_parser("report", help="per-format table with 95%% CIs, convergence and loss plots of a sweep",
                       description="Per format: runs, reached/total, iterations to accuracy (mean with a 95% "
                       "bootstrap CI over seeds; runs that never reached count as lower bounds), median, ratio to "
                       "the baseline with its CI (paired by seed) and a verdict (slower/faster/not "
                       "distinguishable), best accuracy, and fixed-budget final/best accuracy; convergence.png "
                       "and loss.png (mean and 95% CI band over seeds).")
    r.add_argument("sweep", help="a sweep directory (e.g. multirun/<date>/<time>) or any tree of run directories")
    r.add_argument("--baseline", default="fp32", help="format name the ratios refer to (default fp32)")
    r.add_argument("--format", default="text", help="table format: text, md or csv (default text)")
    r.add_argument("--out", default=None, help="write the table to this file instead of stdout")
    r.add_argument("--plot", default=None, help="where to write the accuracy plot (default <sweep>/convergence.png); the loss plot goes "
                   "beside it (<sweep>/loss.png, or <stem>_loss.png)")
    r.add_argument("--no-plot", action="store_true", help="skip the plots")
    r.add_argument("--until-ci", type=float, default=None, metavar="REL",
                   help="say whether each ratio's interval is within ±REL of the ratio (0.1: ±10%%) at the "
                   "seeds-until-precise rule's level, and how many seeds the rule would run next "
                   "(experiments/until_precise.py adds them)")
    r.add_argument("--seed-cap", type=int, default=24, help="with --until-ci: the most seeds per format (default 24)")
    r.set_defaults(func=_cmd_report)

    t = sub.add_parser("tta", help="time to accuracy: iterations (emulation) x seconds per iteration (simulation)",
                       description="TTA = iterations to accuracy x seconds per iteration, per format, with the "
                       "speed-up over the baseline split into throughput gain (t_iter baseline / t_iter format) "
                       "and statistical-efficiency loss (iters format / iters baseline). --hardware gives a "
                       "first-order roofline estimate, not a simulation.")
    t.add_argument("sweep", nargs="?", help="a sweep directory (as for emunum report)")
    t.add_argument("--baseline", default="fp32", help="format name the speed-ups refer to (default fp32)")
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--seconds-per-iteration", nargs="+", metavar="NAME=SECONDS",
                     help="per-iteration time of each format, e.g. fp32=0.031 fp8=0.012")
    src.add_argument("--sim", metavar="FILE", help="simulator results: .yaml/.yml (format: seconds) or .csv "
                     "(columns format,seconds_per_iteration)")
    src.add_argument("--hardware", metavar="NAME|FILE", help="roofline estimate on a hardware description: a "
                     "name in experiments/conf/hardware (h100_like, a100_like) or a YAML file")
    t.add_argument("--format", default="text", help="table format: text, md or csv (default text)")
    t.add_argument("--out", default=None, help="write the table to this file instead of stdout")
    t.set_defaults(func=_cmd_tta)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
