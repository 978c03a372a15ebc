"""The model transport: requests to the Messages API, streaming, retries and fallbacks."""
