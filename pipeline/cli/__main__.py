"""`python -m pipeline.cli`: the `ctxprec` command without its console script."""

import sys

if __name__ == "__main__":
    from ctxprec_entry import hold_signals, leave, release_signals

    hold_signals()  # before the CLI's imports: a stop signal during them ends the command cleanly
    from pipeline.cli.main import main

    code = main()
    release_signals()
    sys.exit(leave(code))
