"""What the scores mean: comparing runs (paired statistics), judge agreement, rechecks,
quality throttles and corrected estimates."""

__all__: list[str] = []
