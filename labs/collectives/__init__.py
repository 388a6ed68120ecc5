"""The collectives lab: each communication primitive, run and checked on every backend."""
