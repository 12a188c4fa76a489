"""One module per `areal-console` subcommand (and `options`: the target options they
share, as the typed record the core takes)."""
