"""Payment providers behind one port: close-or-query, and (with the payments issue) trades and refunds."""
