"""Agent (context description) providers."""
