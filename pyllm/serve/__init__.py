"""Serving: the engine (one scheduler thread, continuous batching), the prefix cache, the HTTP server and its
metrics."""
