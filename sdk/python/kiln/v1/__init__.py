"""gRPC stubs of kiln.v1, generated from proto/kiln/v1 by scripts/sdk-stubs.sh: do not edit."""
