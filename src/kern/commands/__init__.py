"""The kern commands, one module a command, each of one shape: HELP (its line in `kern --help`),
add_arguments(parser) and main(args) -> exit code. args.py holds what they share: the flag
types, the host loop's options and the one line a failed command prints (failed)."""
