"""Services every part of the gateway may use: token estimate, model endpoint, search index, JSONL log,
the responses store, the context window, context levels, and shared text and file helpers."""
