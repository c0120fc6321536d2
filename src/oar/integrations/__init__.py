"""Framework integrations. Each subpackage imports its framework only when used; ``import oar`` never does."""
