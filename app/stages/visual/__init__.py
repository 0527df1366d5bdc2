"""Visual embedding providers."""
