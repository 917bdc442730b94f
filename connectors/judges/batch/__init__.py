"""Provider batch APIs (OpenAI Files + Batches, Anthropic Message Batches) and what they
share."""

__all__: list[str] = []
