"""The entry of every console script: a user's mistake is one line on stderr and exit status 2, a bug a traceback.

    @console_main("wam-diff", subcommands=True)
    def main(argv=None) -> int: ...

A `WamDiffError` prints `<prog>: error: <message>` (with sub-commands `wam-diff decode: error: ...`) and
exits 2; Ctrl-C exits 130 without a word. `--debug` anywhere on the command line (removed before the
script parses it) or WAM_DIFF_DEBUG=1 lets the error through with its traceback. Other exceptions are
never caught.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable, Optional

from .errors import WamDiffError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "WAM_DIFF_DEBUG"
EXIT_USER_ERROR = 2  # argparse's status for a usage error
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def one_line(exc: BaseException) -> str:
    """The exception's message with every run of whitespace (newlines included) collapsed to one space."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
    return " ".join(text.split()) or type(exc).__name__


def strip_debug_flag(args: list[str]) -> tuple[list[str], bool]:
    """`args` without `--debug` (looked for before a bare `--` only), and whether it was there."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != DEBUG_FLAG] + args[end:]
    return kept, len(kept) != len(args)


def console_main(prog: str, subcommands: bool = False) -> Callable:
    """Decorate a console script's `main(argv=None, ...) -> int` (see the module docstring).

    `subcommands`: the first argument, when it is not an option, names a sub-command and joins the
    program name in the error line."""

    def wrap(main: Callable[..., Optional[int]]) -> Callable[..., int]:
        @functools.wraps(main)
        def entry(argv: Optional[list[str]] = None, *args, **kwargs) -> int:
            if argv is None:  # the script reads sys.argv itself (rclpy wants the program name too)
                rest, flag = strip_debug_flag(sys.argv[1:])
                sys.argv[1:] = rest
            else:
                rest, flag = strip_debug_flag(list(argv))
                argv = rest
            if flag:
                os.environ[DEBUG_ENV] = "1"  # child processes (recipe steps, spawned nodes) show theirs too
            debug = flag or debug_enabled()
            name = f"{prog} {rest[0]}" if subcommands and rest and not rest[0].startswith("-") else prog
            try:
                return main(argv, *args, **kwargs)
            except KeyboardInterrupt:
                if debug:
                    raise
                return EXIT_INTERRUPTED
            except WamDiffError as exc:
                if debug:
                    raise
                sys.stdout.flush()
                print(f"{name}: error: {one_line(exc)}", file=sys.stderr)
                return EXIT_USER_ERROR

        entry.console_prog = prog  # which command this entry reports errors as
        return entry

    return wrap
