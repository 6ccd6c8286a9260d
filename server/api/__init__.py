"""Front doors: wire formats in, the application core's typed requests out, errors
mapped to each protocol's status codes. No application logic lives here."""
