"""Built-in backends; each module imports its driver lazily (see kvstores.registry)."""
