"""Planning before renting: memory and halo per layout from the compiled step, the layout search."""
