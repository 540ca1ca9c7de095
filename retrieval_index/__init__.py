"""retrieval_index package."""
