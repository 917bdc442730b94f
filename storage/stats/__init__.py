"""Statistics, pure functions over arrays and columns that import only the leaf: corrected estimates
(PPI), Cohen's kappa and judge agreement, paired tests of two outputs, and the seeded hash
sample."""

__all__: list[str] = []
