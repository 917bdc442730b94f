"""What the scores mean: comparing runs (paired statistics), judge agreement, rechecks,
quality gates and corrected estimates."""

__all__: list[str] = []
