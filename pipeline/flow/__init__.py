"""The flow of one batch of rows: plan (row checks, memo keys, memo lookup) -> fan out ->
judge (`dispatch`) -> reduce to MAP -> the reason."""

__all__: list[str] = []
