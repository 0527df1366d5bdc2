"""What every browser-facing surface shares: security headers, browser sessions (token mode),
CSRF and same-origin checks. The pages themselves live with their blueprints (/ops, /api/docs)."""
