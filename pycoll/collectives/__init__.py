"""The collectives, one module per family; pycoll/__init__.py re-exports them."""
