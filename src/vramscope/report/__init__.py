"""The Report model, pure analysis over it, and its renderers (terminal, JSON, HTML, exports)."""
