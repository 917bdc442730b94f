"""One run end to end: prepare and finish (`driver`), the stage that streams the input
through the flow (`stage`), progress, notices, partitioned parts, sinks, signals, the cost
estimate."""

__all__: list[str] = []
