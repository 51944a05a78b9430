"""gRPC stubs of kiln.v1, generated from proto/kiln/v1 while the package builds (setup.py)."""
