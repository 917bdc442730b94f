"""Where ctxprec's files live and how they are reached: the layout naming every path of an output
folder and a memo folder, local and object-store filesystems, the one atomic write, and the rule
that keeps every path inside its folder."""

__all__: list[str] = []
