"""Subcommands of the ``quotientsharp`` console script, one module each.

Every module listed in :data:`COMMANDS` exposes ``add_parser(subparsers)`` and ``run(args) -> int``
and imports its heavy dependencies inside ``run``, so ``quotientsharp --help`` stays fast.
"""

COMMANDS = {
    "verify": "quotientsharp.commands.verify",
    "symmetries": "quotientsharp.models.cli",
    "measure": "quotientsharp.commands.measure",
    "reproduce": "quotientsharp.commands.reproduce",
}
