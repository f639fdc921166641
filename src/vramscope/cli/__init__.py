"""The ``vramscope`` command: one module per verb, each thin (parse, call the API, render)."""
