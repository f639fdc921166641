"""Batch search, micro-batch × accumulation plans, and strategy comparison."""
