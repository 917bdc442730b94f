"""The `ctxprec` command: the parser and its help (`main`, `help`), and one module per
subcommand, imported only when that command runs."""

__all__: list[str] = []
