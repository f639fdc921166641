"""Thin clients of ``track()`` and ``estimate()`` for Lightning, Hugging Face, pytest and IPython.

Each integration imports its framework only when its module is imported:
``vramscope.integrations.lightning``, ``vramscope.integrations.transformers``,
``vramscope.integrations.pytest_plugin`` (loaded by pytest through its entry point) and
``vramscope.integrations.ipython`` (``%load_ext vramscope``).
"""
