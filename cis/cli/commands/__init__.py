"""One module per ``cis`` subcommand: ``add_parser(subparsers)`` and ``run(args)``."""
