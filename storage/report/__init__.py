"""What a run leaves for people and machines: the summary (JSON, Markdown), the comparison,
charts, the trend across nights and the HTML report."""

__all__: list[str] = []
