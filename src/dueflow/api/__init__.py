"""HTTP: the provider notify routes (the buyer, seller and admin API comes with the service issue)."""
