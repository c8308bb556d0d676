"""Built-in middleware adapters; each subpackage is registered like a third-party plugin."""
