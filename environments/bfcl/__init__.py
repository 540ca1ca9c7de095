"""BFCL v4 multi-turn function calling on the real bfcl-eval backends (``trace_gym/BFCL-v0``)."""
