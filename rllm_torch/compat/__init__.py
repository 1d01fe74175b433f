"""Compatibility packages: other libraries' import paths over this package's one implementation."""

__all__: list[str] = []
