"""qmailctl subcommands: one module each, exposing HELP, add_arguments(parser) and run(args) -> exit code."""
