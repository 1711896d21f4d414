"""A module that fails on import."""

1 / 0  # noqa: B018
