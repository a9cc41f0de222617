"""The core: the tiled algorithm written once, its masks, score modifications, dropout, merges
and sinks, the naive reference, and a call's preparation and input checks."""
