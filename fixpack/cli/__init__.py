"""The command line and its output: `fixpack` parses and dispatches (main), one module per
command (commands/), and the status lines every command prints (output)."""
