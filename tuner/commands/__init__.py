"""`kiln` subcommands, one module each."""
