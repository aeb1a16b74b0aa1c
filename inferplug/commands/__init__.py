"""CLI subcommands. Each module exposes `register(subparsers)`, which adds its parser and sets `func`
(called with the parsed args; returns the exit code or None). inferplug.cli finds them with pkgutil."""
