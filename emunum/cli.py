"""``emunum`` command line: ``emunum formats`` (more subcommands register below)."""
from __future__ import annotations

import argparse
import sys

from .formats import PRESETS
from .spec import FloatFormat


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


def _cmd_formats(args) -> int:
    print(formats_table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emunum", description="emunum: reduced-precision numerics emulation")
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("formats", help="print the preset format table")
    f.set_defaults(func=_cmd_formats)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
