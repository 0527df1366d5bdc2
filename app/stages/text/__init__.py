"""Text embedding providers."""
