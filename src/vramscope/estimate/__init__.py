"""Predicting GPU memory without running: fake-tensor tracing and a caching-allocator simulator."""
