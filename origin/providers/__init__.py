"""The providers the origin calls: an OpenAI-compatible provider is data (its spec and
routes in the providers file), Anthropic gets an adapter of its own; the HTTP base they
share, the answers' token counts, and what each model costs (prices.toml)."""
