"""The `pplan` command line: thin typer commands over the `planner` library."""
