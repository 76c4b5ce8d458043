"""Local stand-ins for services that have no Google emulator (Workflows, Compute Engine, ...)."""
