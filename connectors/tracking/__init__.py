"""Where a finished run is also tracked: MLflow (`mlflow_runs`) and OpenTelemetry
(`otel_events`). Each imports its library only when a run uses it."""

__all__: list[str] = []
