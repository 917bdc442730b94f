"""Everything that talks across a boundary: judge providers, input readers, output sinks."""

__all__: list[str] = []
