"""Shared leaf under every fullres package: console sentences, output safety, parsing, sizes, dead letters.

Imports nothing of fullres; everything else may import it."""
