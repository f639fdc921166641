"""Live measurement of a real run: session, phase hooks, sampler, categories, OOM report."""
