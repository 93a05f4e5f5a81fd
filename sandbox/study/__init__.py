"""The claims study engine (issue 26): the page (docs/claims.md) from page.md and the tables."""
