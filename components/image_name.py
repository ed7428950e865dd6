"""The container image every component runs in unless `fullres pipeline compile --image` names another.

A module of its own, importing nothing: `fullres --help` reads the name without
loading KFP (`components.steps` imports it).
"""

DEFAULT_IMAGE = "fullres:latest"
