"""The scripted model server (the harness tests' one test double) and its deployment helper."""
