"""Agent environments shipped with trace_gym (each family in its own subpackage)."""
