"""One module per `areal-console` subcommand."""
