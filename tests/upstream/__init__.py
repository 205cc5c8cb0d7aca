"""A fake OpenAI / Anthropic provider used by tests and benchmarks (see ``server``)."""
