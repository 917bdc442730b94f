"""`python -m pipeline.cli`: the `ctxprec` command without its console script."""

import sys

from pipeline.cli.main import main

if __name__ == "__main__":
    from ctxprec_entry import leave

    sys.exit(leave(main()))
