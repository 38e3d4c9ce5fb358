"""CPU attention worker."""
