"""The verdict memo: the on-disk store of paid verdicts and its key recipe, the database it is read
from without trusting it, the fixed layout of a stored verdict, and the journal that keeps a killed
run's verdicts."""

__all__: list[str] = []
